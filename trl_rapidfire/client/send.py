"""Sending ops from another process: the CLI's and a person's Python calls.

An op is checked here as every sender checks it (its syntax; whether the run's status rules it
out), then delivered: as the run's ``rapidfire.op`` tag on the experiment's tracking server, or
as a file in the inbox of an experiment MLflow does not track. The training process applies it
at its next chunk boundary and answers in the same place. The op language itself:
:mod:`trl_rapidfire.control.ops.ops`.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..control.folder_control import (
    LOOK_DEPTH,
    Inbox,
    alive,
    folder_runs,
    is_untracked,
    live_folders,
)
from ..control.ops import Op, parse_op
from ..storage.layout import Layout, run_order
from .experiments import Experiment, experiment_runs, find_experiment

__all__ = [
    "Delivery",
    "Experiment",
    "check_op",
    "clone",
    "delete",
    "deliver_op",
    "experiment_runs",
    "find_experiment",
    "replaced_warning",
    "resume",
    "send_op",
    "stop",
]


@dataclass(frozen=True)
class Delivery:
    """Where a sent op went.

    Attributes:
        target: the experiment, as a person tells it apart (``'demo' (1a2b3c4d, training)``,
            or its folder for an experiment MLflow does not track).
        training: whether a training process will apply it at its next chunk boundary (else
            the script's next ``train()`` does: :attr:`applies` says it in words).
        run_id: the MLflow run tagged; ``None`` where the op is a file in the experiment's
            inbox (:mod:`.folder_control`).
        replaced: the op that was waiting on the run, not answered yet, which this one
            replaced (a run has one op tag: the experiment never sees the one replaced).
        folder: the experiment folder whose inbox holds the op (``run_id`` is ``None``).
    """

    target: str
    training: bool
    run_id: str | None = None
    replaced: str | None = None
    folder: str | None = None

    @property
    def applies(self) -> str:
        """When the op is applied, for a person: every op sent is (or is refused when sent)."""
        if self.training:
            return "at the run's next chunk boundary"
        return ("at the next train() of its script (the script run again on the same "
                "output_dir), before that train() ends")


def check_op(run: str, op: str, status: str | None = None) -> Op:
    """``op`` for ``run`` as every sender checks it before sending: its syntax (raises
    :class:`OpError`) and, when the run's ``status`` is known, whether that status rules it out
    (stopping a completed run, resuming a running one: raises ``LookupError``)."""
    from ..shared_state.runs import RunStatus, status_op_refusal

    parsed = parse_op(op)
    if status in {s.value for s in RunStatus} and not parsed.is_clone:
        refusal = status_op_refusal(run, RunStatus(status), parsed.verb)
        if refusal is not None:
            raise LookupError(refusal)
    return parsed


def send_op(run: str, op: str, *, next_run: bool = False, **where: Any) -> str | None:
    """Send ``op`` to ``run`` (see :func:`deliver_op`); returns the MLflow run id it was set
    on (``None`` where it went to the experiment's inbox: an untracked experiment, or one whose
    ``train()`` has just started). Warns when it replaced an op not yet applied."""
    sent = deliver_op(run, op, next_run=next_run, **where)
    if sent.replaced is not None:
        warnings.warn(replaced_warning(run, sent.replaced, op), RuntimeWarning, stacklevel=2)
    return sent.run_id


def replaced_warning(run: str, replaced: str, op: str) -> str:
    """What a sender is told when its op replaced one the experiment had not answered."""
    return (f"{run} had the op {replaced!r} waiting, not applied yet; {op!r} replaced it, so "
            f"{replaced!r} will not be applied. A run holds one op at a time: send the next "
            "once the last is answered (its rapidfire.op.result, or trl-rapidfire status).")


def _not_training(what: str, op: str) -> LookupError:
    return LookupError(
        f"{what} is not training, so nothing would apply {op!r} until its script runs again: "
        "re-run the script first, or add --next-run (Python: next_run=True) to leave the op "
        "for its next train()")


def deliver_op(run: str, op: str, *, next_run: bool = False, **where: Any) -> Delivery:
    """Send ``op`` to ``run``, checked first (:func:`check_op`).

    ``where``: ``output_dir=``, ``experiment=`` and/or ``uri=`` as for :func:`find_experiment`;
    with none of them, the experiment that is training in the store. A tracked experiment gets
    the op as the run's tag ``rapidfire.op``, as from the MLflow UI; one MLflow does not track
    (an ``output_dir`` with ``report_to="none"``) as a file in its inbox. The training process
    applies it at its next chunk boundary and answers it.

    A ``train()`` that has just started is not in the store yet (its tracking thread makes
    the store, the experiment and its runs there in the background, seconds in): its folder
    says it trains from the first moment (``.rapidfire/alive.json``), so the op goes to its
    inbox, which every experiment reads at each chunk boundary. That folder is the one named
    (``output_dir``), else the one training under the working folder
    (:func:`~trl_rapidfire.control.folder_control.live_folders`).

    Refused (``LookupError``, with the reason, and where it looked) when the experiment is not
    training, unless ``next_run`` (the op then waits for its script's next ``train()``, which
    applies it), when there is no such run, when the run's status rules the op out, and when
    the next ``train()`` could not apply it (a warm clone of a completed run whose process
    has ended: no checkpoint to start from).
    """
    parsed = check_op(run, op)  # a typo is said first, before any store is opened
    output_dir = where.get("output_dir")
    if output_dir is not None and is_untracked(output_dir):
        return _deliver_to_folder(run, op, output_dir, next_run)
    from ..tracking.tags import OP_TAG, RUN_TAG, STATUS_TAG
    from .tracked_runs import open_catalog

    try:
        exp = find_experiment(**where, latest_if_none_training=next_run)
    except LookupError as err:
        folder = _starting_folder(where, str(err))
        return _deliver_to_inbox(run, op, folder, f"{folder}'s inbox (its train() has just "
                                 "started: the MLflow store does not list it yet)")
    if not exp.training:
        starting = _live_tracked(where, exp)
        if starting:  # a train() began: the store says so in a moment
            folder = _one_starting(starting, f"no experiment is training in {exp.uri}")
            said = (f"the store reads {exp.state} until its tracking thread says it trains"
                    if _marker_id(folder) == exp.rf_experiment
                    else "the MLflow store does not list it yet")
            return _deliver_to_inbox(run, op, folder, f"{folder}'s inbox (its train() has "
                                     f"just started: {said})")
        if not next_run:
            raise _not_training(f"experiment {exp.describe()}", op)
    runs = experiment_runs(exp)
    for tracked in runs:
        if tracked.tags.get(RUN_TAG) != run:
            continue
        status = tracked.tags.get(STATUS_TAG)
        try:
            check_op(run, op, status)
            if not exp.training:
                _next_run_check(run, parsed, status, exp)
        except LookupError as err:
            raise LookupError(f"{err} (experiment {exp.describe()})") from None
        waiting = tracked.tags.get(OP_TAG) or None
        open_catalog(exp.uri).set_tag(tracked.run_id, OP_TAG, op)
        return Delivery(f"experiment {exp.describe()}", exp.training, tracked.run_id,
                        replaced=waiting)
    names = [r.tags.get(RUN_TAG) for r in runs]
    # The store says it trains: a folder named is its folder; else the one training here.
    folders = ([] if not exp.training else [Path(output_dir)] if output_dir is not None
               else _live_tracked(where, exp, only=True))
    if folders and run not in names:
        # A training experiment makes its runs' MLflow runs in the background as it starts
        # (the first chunk does not wait for them): a run its folder already has gets the op
        # through the folder's inbox, which the experiment reads at every chunk boundary too.
        return _deliver_to_inbox(run, op, folders[0], f"experiment {exp.describe()} "
                                 f"(through {folders[0]}: its MLflow run is not made yet)")
    later = (" (the experiment is starting and registers its runs in MLflow in the "
             f"background, and no folder training it was found{_looked(where)}: if it has "
             "that run, try again in a moment, or name its folder with --dir / output_dir= "
             "to send the op there now)" if exp.training else "")
    raise LookupError(f"no run named {run!r} in experiment {exp.name!r}; runs: {names}{later}")


# How long an op for an experiment whose train() has just started waits for its runs to be in
# its shared state (registered in one go as the train() begins).
START_WAIT = 10.0


def _looked(where: Mapping[str, Any]) -> str:
    """Where :func:`_live_tracked` looked, for a message."""
    if where.get("output_dir") is not None:
        return f" ({Layout(where['output_dir']).alive_file} names no live process)"
    return (f" (looked for .rapidfire/alive.json of a live process in {Path.cwd()} and the "
            f"folders {LOOK_DEPTH} levels below it)")


def _live_tracked(where: Mapping[str, Any], exp: Experiment | None = None, *,
                  only: bool = False) -> list[Path]:
    """The tracked experiment folders that a live process trains now and ``where`` may mean:
    the folder named, else those under the working folder; of them, with an experiment
    named, those of its name (a folder's base name, by default) or of ``exp``'s id; with
    ``only``, those of ``exp`` alone."""
    output_dir = where.get("output_dir")
    if output_dir is not None:
        return [Path(output_dir)] if alive(Layout(output_dir)) is not None else []
    found = [f for f in live_folders(Path.cwd()) if Layout(f).experiment_marker.is_file()]
    ours = exp.rf_experiment if exp is not None else None
    named = where.get("experiment")
    if only:
        return [f for f in found if _marker_id(f) == ours]
    if named is not None:
        return [f for f in found if f.name == named or _marker_id(f) == ours]
    return found


def _marker_id(folder: Path) -> str | None:
    from ..tracking.tags import read_experiment_id

    try:
        return read_experiment_id(Layout(folder).experiment_marker)
    except (OSError, ValueError):
        return None


def _starting_folder(where: Mapping[str, Any], problem: str) -> Path:
    """The folder of the one experiment whose ``train()`` has just started, when the store
    cannot say which experiment is training (``problem``: what it said); or ``LookupError``
    naming what is missing and where it looked."""
    folders = _live_tracked(where)
    if not folders:
        named = where.get("output_dir") is not None
        raise LookupError(f"{problem}; and no experiment is starting either{_looked(where)}: "
                          "start its script first" + ("" if named else
                                                      ", or name its output_dir with --dir"))
    return _one_starting(folders, problem)


def _one_starting(folders: list[Path], problem: str) -> Path:
    """The one folder of ``folders`` (experiments starting), or ``LookupError`` naming them."""
    if len(folders) == 1:
        return folders[0]
    shown = ", ".join(str(f) for f in folders[:5])
    raise LookupError(f"{problem}; {len(folders)} experiments are starting under "
                      f"{Path.cwd()}: {shown}; choose one with --dir")


def _next_run_check(run: str, op: Op, status: str | None, exp: Experiment) -> None:
    """Refuse (``LookupError``) an op that the next ``train()`` of a finished ``exp`` could
    not apply, beyond what the run's status rules out (:func:`check_op`)."""
    if op.warm and status == "completed" and exp.process_gone:
        raise LookupError(
            f"{run} has no checkpoint to warm-start from (a completed run keeps only its "
            "final weights, and the process that held them in memory has ended), so the next "
            f"train() could not apply {str(op)!r}; use clone")


def _deliver_to_inbox(run: str, op: str, folder: Path, target: str) -> Delivery:
    """Leave ``op`` in the inbox of the experiment training in ``folder``, checked against
    ``run``'s status in its shared state first. Its runs are put there as its ``train()``
    begins: while none is yet, and a process trains it, the op waits a moment for them."""
    layout = Layout(folder)
    deadline = time.monotonic() + START_WAIT
    while (others := _checked_in_folder(run, op, folder)) is not None:
        if others or time.monotonic() > deadline or alive(layout) is None:
            empty = (f" (its shared state, {layout.scheduler_state}, has no runs yet)"
                     if not others else "")
            raise LookupError(f"no run named {run!r} in {folder}; runs: {others}{empty}")
        time.sleep(0.2)
    Inbox(layout).post(run, op)
    return Delivery(target, True, folder=str(folder))


def _checked_in_folder(run: str, op: str, output_dir: str | os.PathLike) -> list[str] | None:
    """``op`` checked against ``run``'s status in the shared state of ``output_dir``
    (``LookupError`` when the status rules it out); ``None`` when the run is there, else
    the names of the runs that are."""
    runs = {r.name: r for r in folder_runs(output_dir)}
    if run not in runs:
        return sorted(runs, key=run_order)
    check_op(run, op, runs[run].status)
    return None


def _deliver_to_folder(run: str, op: str, output_dir: str | os.PathLike, next_run: bool
                       ) -> Delivery:
    others = _checked_in_folder(run, op, output_dir)
    if others is not None:
        raise LookupError(f"no run named {run!r} in {output_dir}; runs: {others}")
    layout = Layout(output_dir)
    training = alive(layout) is not None
    if not training and not next_run:
        raise _not_training(f"the experiment in {output_dir}", op)
    Inbox(layout).post(run, op)
    return Delivery(f"{output_dir} (not tracked in MLflow)", training, folder=str(output_dir))


def stop(run: str, **where: Any) -> str | None:
    """Ask the experiment to stop ``run`` (see :func:`send_op`)."""
    return send_op(run, "stop", **where)


def resume(run: str, **where: Any) -> str | None:
    """Ask the experiment to resume the stopped ``run``."""
    return send_op(run, "resume", **where)


def delete(run: str, **where: Any) -> str | None:
    """Ask the experiment to delete ``run`` for good."""
    return send_op(run, "delete", **where)


def clone(run: str, overrides: Mapping[str, Any] | None = None, *, warm: bool = False,
          **where: Any) -> str | None:
    """Ask the experiment to clone ``run`` with ``overrides`` (warm-started with ``warm``)."""
    verb = "clone-warm" if warm else "clone"
    return send_op(run, f"{verb} {json.dumps(dict(overrides or {}))}", **where)
