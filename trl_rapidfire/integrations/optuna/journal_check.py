"""What an Optuna search checks of its study's journal, so that a journal that is damaged,
emptied or edited is named as such (the file, what is wrong, what to do) before anything
trains, instead of Optuna's bare ``AssertionError`` or a new study quietly started.

* each line, before Optuna reads it (:func:`check_line`): a JSON object whose ``op_code`` is
  one Optuna writes and whose ``worker_id`` is text;
* the file itself (:func:`check_file`): a regular file of one name (Optuna appends to it by
  path: a hard link would have its appends land in a file elsewhere too), in a folder reached
  from ``output_dir`` without a link;
* the study Optuna read, against ``search.csv``, the record the experiment keeps of every
  proposal (:func:`check_study`): every trial logged as proposed is in the study, as the run
  it was proposed for, with the params logged for it; every proposed trial's params lie in
  the search space; a trial the sampler did not propose (a clone's) was added finished, so
  none waits to be given to a run (an enqueued one would be).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...shared_state.store import StoreError
from ...storage.write_path import hard_linked, open_folder
from .space import SearchSpace, params_text

__all__ = ["check_file", "check_line", "check_study", "damaged"]

# Optuna's JournalOperation values (CREATE_STUDY .. DISCARD_TRIALS): any other is not a line
# Optuna wrote, and its replay stops at it with a bare AssertionError.
_OP_CODES = frozenset(range(11))


def damaged(path: Path, what: str) -> StoreError:
    """The error for the study's journal at ``path``: ``what`` is wrong with it."""
    return StoreError(f"{path} (the Optuna study of this experiment's search) {what}. "
                      "trl-rapidfire does not continue a search from it: restore the file "
                      "from a backup, or start the search anew in another output_dir.")


def check_line(value: Any, path: Path) -> None:
    """``value`` (one line of the journal, parsed) is a line Optuna writes; else
    :func:`damaged`."""
    if not isinstance(value, dict):
        raise damaged(path, f"is damaged: a line is {type(value).__name__}, not an operation")
    code = value.get("op_code")
    if isinstance(code, bool) or not isinstance(code, int) or code not in _OP_CODES:
        raise damaged(path, f"is damaged: a line has op_code {code!r}, which Optuna never "
                            "writes")
    if not isinstance(value.get("worker_id"), str):
        raise damaged(path, "is damaged: a line has no worker_id")


def check_file(path: Path, st: os.stat_result) -> None:
    """The journal at ``path`` (``st``: its ``lstat``) has one name, and its folder is reached
    from the experiment's root without a link (Optuna writes it by path)."""
    if st.st_nlink != 1:
        raise StoreError(str(hard_linked(path, st.st_nlink)))
    try:
        os.close(open_folder(path.parent, make=False))
    except ValueError as err:  # LinkRefused
        raise StoreError(str(err)) from None


def check_study(path: Path, trials: Sequence[Any], space: SearchSpace,
                log_rows: Sequence[Mapping[str, str]]) -> None:
    """The study's ``trials`` (as Optuna read them from ``path``) agree with the search log's
    rows (``search.csv``) and ``space``; else :func:`damaged`, saying how."""
    by_number = {t.number: t for t in trials}
    logged: dict[int, Mapping[str, str]] = {}
    for row in log_rows:
        number = row.get("trial") or ""
        if row.get("event") == "proposed" and number.isdigit():
            logged.setdefault(int(number), row)
    missing = sorted(set(logged) - set(by_number))
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise damaged(path, f"was emptied or cut: search.csv logs trial(s) {shown} as "
                            f"proposed, and the study holds {len(trials)} trial(s)")
    for at, row in sorted(logged.items()):
        trial = by_number[at]
        if trial.user_attrs.get("run") != row.get("run") or (
                params_text(trial.params) != row.get("detail")):
            raise damaged(path, f"was edited: trial {at} is {params_text(trial.params)} "
                                f"for {trial.user_attrs.get('run')!r}; search.csv logs it "
                                f"proposed as {row.get('detail')} for {row.get('run')!r}")
    for trial in trials:
        attrs = trial.user_attrs
        if attrs.get("proposed"):
            for name, value in trial.params.items():
                if name not in space.distributions or not space.holds(name, value):
                    raise damaged(path, f"was edited: trial {trial.number} has {name}="
                                        f"{value!r}, outside the search space")
        elif not trial.state.is_finished():  # a clone's trial is added told; none waits
            raise damaged(path, f"was edited: trial {trial.number} "
                                f"({trial.state.name.lower()}) was not proposed by the "
                                "search's sampler, yet waits to be trained")
