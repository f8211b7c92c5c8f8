"""The study an :class:`~trl_rapidfire.integrations.optuna.search.OptunaSearch` keeps: Optuna's
journal
storage in ``<output_dir>/.rapidfire/optuna.journal``, shared by the experiment's workers and
continued by a re-run. :class:`StudyBook` is the engine's
:class:`~trl_rapidfire.engine.proposals.Proposer`.

What makes it safe to share and to resume:

* every ask, tell and added trial happens under one file lock (``optuna.lock`` beside it), so
  two workers never take the same trial number, and the trial's state in the study says
  whether it was told: a result is told once, by whichever worker gets there first;
* each trial carries its run's name (user attribute ``run``): a re-run finds the runs' trials
  instead of asking again, and a trial asked just before a crash (its run never reached the
  shared state) is given to the run of that name when it is asked for again;
* the sampler of trial ``n`` is made afresh, seeded from the search's seed and ``n``: what it
  proposes depends on the study (on disk) and that seed only, not on how many proposals an
  earlier process made before it died.

Every proposal and told result is also a row of ``<output_dir>/search.csv`` (time, event,
run, trial, detail), which ``trl-rapidfire status`` and the report read without Optuna.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from filelock import FileLock

from ...control.policies import RunHistory, chunk_values
from ...engine.proposals import Proposal
from ...shared_state.runs import RunStatus
from ...shared_state.scheduler import Order
from ...shared_state.store import StoreError
from ...storage.csv_logs import append_row, read_rows
from ...storage.layout import Layout, run_name
from ...storage.outside_text import SMALL_FILE_BYTES, STATE_BYTES, OutsideTextError, loads
from ...storage.own_files import open_nofollow
from ...storage.write_path import open_folder
from .journal_check import check_file, check_line, check_study, damaged
from .space import SearchSpace, params_text
from .support import quiet_optuna, require_optuna

__all__ = ["SAMPLER_DONE", "STUDY_NAME", "SEARCH_LOG_FIELDS", "StudyBook"]

STUDY_NAME = "trl-rapidfire"
# A study attribute: the sampler called Study.stop() (a GridSampler once every point was tried,
# a BruteForceSampler once its space was): it proposes nothing more, also after a re-run.
SAMPLER_DONE = "rapidfire.sampler_done"
# A proposal's params are {name: number, name or index}: one level, and no more is read.
_PARAMS_DEPTH = 2
SEARCH_LOG_FIELDS = ("time", "event", "run", "trial", "detail")
# Intermediate values are written to the journal at most this often (seconds), by each worker.
# Each is an fsync'd line (1 to 4 ms): at every 2-step chunk of a tiny model that was a tenth
# of the training time, for values no sampler reads while the trial runs (TPE reads finished
# trials; our pruner keeps its own study). A run's values all go in when it is told.
REPORT_EVERY = 1.0


class StudyBook:
    """A study over ``space``, kept in the experiment's folder.

    Args:
        space: the parameters, and how they map to knob values.
        layout: the experiment's paths (the study, its lock, the search log).
        sampler_for: the sampler that proposes trial number ``n``.
        sampler_name: what proposes the runs, for their tags.
        num_runs: how many runs the sampler proposes in all.
        max_concurrent: how many runs train at a time.
        metrics, directions: the study's objectives (logged metrics) and their directions;
            several make a multi-objective study.
        grid: a ``GridSampler``'s points ({parameter: values}), or ``None``: the search then
            proposes each point once and ends when every point was proposed.
        order: which runs in the rotation train first (the engine's scheduler reads it).
    """

    def __init__(self, space: SearchSpace, layout: Layout, *, sampler_for: Callable[[int], Any],
                 sampler_name: str, num_runs: int, max_concurrent: int,
                 metrics: Sequence[str], directions: Sequence[str],
                 grid: Mapping[str, Sequence[Any]] | None = None,
                 order: Order = Order.EVEN) -> None:
        optuna = require_optuna("OptunaSearch")
        self._optuna = optuna
        self.space = space
        self.sampler_for, self.sampler_name = sampler_for, sampler_name
        self.num_runs, self.max_concurrent, self.order = num_runs, max_concurrent, order
        self.metrics, self.directions = tuple(metrics), tuple(directions)
        self.grid = None if grid is None else {k: list(v) for k, v in sorted(grid.items())}
        os.close(open_folder(layout.state_dir))  # made; never through a link
        self.path = layout.study_journal
        self.log_path = layout.search_log
        self._lock = FileLock(str(layout.study_lock))
        self._checked = 0  # bytes of the journal already read as data (_check_journal)
        # The trials seen so far, by run: a look-up costs the trials added since the last
        # (by any worker), not a pass over the study (O(N) at every chunk end, before).
        self._numbers: dict[str, int] = {}
        self._scanned = 0  # trials 0 .. _scanned - 1 are in _numbers / _proposed
        self._proposed = 0  # how many of them the sampler proposed
        self._reported_at = -math.inf  # when report() last wrote (time.monotonic())
        journal = optuna.storages.journal
        with self._locked(), quiet_optuna():  # the lock checks the journal, then Optuna reads
            try:
                self.storage = optuna.storages.JournalStorage(
                    journal.JournalFileBackend(str(self.path)))
                self.study = optuna.create_study(study_name=STUDY_NAME, storage=self.storage,
                                                 directions=list(directions),
                                                 load_if_exists=True)
            except (AssertionError, KeyError, TypeError, ValueError, AttributeError) as err:
                # Lines that parse and name an operation, yet do not replay (a field missing).
                raise damaged(self.path, f"is damaged ({type(err).__name__}: {err})") from None
            # Emptied or edited since search.csv logged the proposals: named, before training.
            check_study(self.path, self._trials(), space, read_rows(self.log_path))
        held = tuple(d.name.lower() for d in self.study.directions)
        if held != self.directions:
            raise ValueError(f"{self.path} holds a study that goes {' and '.join(held)}; this "
                             f"search goes {' and '.join(directions)}. Use another output_dir.")
        self._study_id = self.storage.get_study_id_from_name(STUDY_NAME)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self._check_journal()
            yield

    def _check_journal(self) -> None:
        """Under the lock, before Optuna reads it: the lines appended to the journal since the
        last look are JSON within the bounds of any state file (Optuna's parser recurses, and
        a bad line would reach the user as a bare ``JSONDecodeError``); a damaged line, or a
        link, FIFO, socket or device where the journal is, is a :class:`StoreError` naming the
        file."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            self._checked = 0
            return
        if st.st_size < self._checked:  # replaced by another (restored) journal: read it all
            self._checked = 0
            self._numbers, self._scanned, self._proposed = {}, 0, 0
        # Only a regular file may skip the read: Optuna opens the journal itself, with a plain
        # blocking open(), so a FIFO (size 0, as an empty journal) would hang it forever.
        # open_nofollow opens without blocking and refuses anything but a regular file.
        # Optuna appends to it by path: one name only, in a folder reached without a link.
        check_file(self.path, st)
        if st.st_size == self._checked and stat.S_ISREG(st.st_mode):
            return
        try:
            fd = open_nofollow(self.path, os.O_RDONLY)
        except ValueError as err:  # a link, or not a file
            raise StoreError(str(err)) from None
        try:
            data = os.pread(fd, st.st_size - self._checked, self._checked)
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1  # a line still being written (or torn) waits
        for raw in data[:end].splitlines():
            try:
                line = loads(raw, what="a line", max_bytes=STATE_BYTES)
            except OutsideTextError as err:
                raise StoreError(f"{self.path} has a damaged line ({err}): restore it, or use "
                                 "another output_dir") from None
            check_line(line, self.path)  # an operation Optuna's replay knows
        self._checked += end

    def _trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self._study_id, number)

    def _trials(self) -> list[Any]:
        return self.study.get_trials(deepcopy=False)

    def _scan(self) -> None:
        """Take in the trials added since the last look (every trial is named under the lock
        in the section that made it, so a trial seen once keeps its run)."""
        while True:
            try:
                trial_id = self._trial_id(self._scanned)
            except KeyError:
                return
            attrs = self.storage.get_trial(trial_id).user_attrs
            if "run" in attrs:
                self._numbers[attrs["run"]] = self._scanned
            self._proposed += bool(attrs.get("proposed"))
            self._scanned += 1

    def _trial_of(self, name: str) -> Any:
        """Run ``name``'s trial as it is now, or ``None``."""
        number = self._numbers.get(name)
        if number is None:
            self._scan()
            number = self._numbers.get(name)
        return None if number is None else self.storage.get_trial(self._trial_id(number))

    # ------------------------------------------------------------------ proposing

    def first_runs(self) -> list[Proposal]:
        """The runs that start the experiment: ``run-0`` .. one per rotation place (asked
        now, or found in the study when another worker or an earlier session asked)."""
        count = min(self.max_concurrent, self.num_runs)
        with self._locked():
            # A grid smaller than the rotation: the places beyond its points stay empty.
            return [self._propose(name) for name in map(run_name, range(count))
                    if self._trial_of(name) is not None or self.more()]

    def more(self) -> bool:
        """Whether the sampler has proposals left: ``num_runs`` counts them; a grid ends
        once each of its points was proposed, any sampler once it called ``Study.stop``."""
        self._scan()
        if self._proposed >= self.num_runs or self.study.user_attrs.get(SAMPLER_DONE):
            return False
        return self.grid is None or self._grid_points_left(self._trials()) > 0

    def _grid_points_left(self, trials: Sequence[Any]) -> int:
        """The grid's points no trial was given yet. GridSampler gives trial n < its size the
        n-th point and a later one an unvisited point, and records it in the trial's system
        attributes (``grid_id``, with the grid it is of); a running trial's point counts as
        given, so two running runs never share one."""
        assert self.grid is not None
        size = 1
        for values in self.grid.values():
            size *= len(values)
        given = {t.system_attrs["grid_id"] for t in trials if "grid_id" in t.system_attrs
                 and t.system_attrs.get("search_space") == self.grid}
        return size - len(given)

    def propose(self, name: str) -> Proposal:
        """The next run, ``name``: the sampler's next trial."""
        with self._locked():
            return self._propose(name)

    def _propose(self, name: str) -> Proposal:
        trial = self._trial_of(name)  # scans every trial made so far when it has none
        if trial is None:
            number = self._scanned
            self.study.sampler = self.sampler_for(number)
            with quiet_optuna():
                asked = self.study.ask(fixed_distributions=self.space.distributions)
            asked.set_user_attr("run", name)
            asked.set_user_attr("proposed", True)
            self._scan()
            trial = self.storage.get_trial(self._trial_id(asked.number))
            self._log("proposed", name, trial.number, params_text(trial.params))
        return Proposal(name=name, trial=trial.number, knobs=self.space.knobs(trial.params),
                        params=params_text(trial.params), tags=self._tags(trial))

    def from_recipe(self, name: str, trial: int, params: str) -> Proposal:
        """The run ``name`` as its recipe has it (trial ``trial``, the sampler's ``params``
        as JSON text). Raises ``ValueError`` for params that are not this search's."""
        values = loads(params, what="its params", max_bytes=SMALL_FILE_BYTES,
                       max_depth=_PARAMS_DEPTH)
        if not isinstance(values, dict):
            raise ValueError(f"its params are not a mapping: {params!r}")
        knobs = self.space.knobs(values)
        found = self._trial_of(name)
        tags = self._tags(found) if found is not None and found.number == trial else {
            "rapidfire.trial": str(trial)}
        return Proposal(name=name, trial=trial, knobs=knobs, params=params_text(values),
                        tags=tags)

    def tags_of(self, name: str) -> dict[str, str]:
        """Run ``name``'s tracking tags: its trial, what proposed it and when."""
        trial = self._trial_of(name)
        return {} if trial is None else self._tags(trial)

    def _tags(self, trial: Any) -> dict[str, str]:
        when = trial.datetime_start
        return {"rapidfire.trial": str(trial.number),
                "rapidfire.proposed_by": f"{self.sampler_name} (trial {trial.number})",
                **({"rapidfire.proposed_at": when.isoformat(timespec="seconds")} if when else {})}

    # ------------------------------------------------------------------ telling

    @property
    def multi(self) -> bool:
        """Several objectives (a Pareto front; no intermediate values)."""
        return len(self.metrics) > 1

    def report(self, history: RunHistory) -> None:
        """The values of the metric at the chunk ends ``history``'s run reached, as its
        trial's intermediate values (those it has are left alone); a finished trial, or a run
        without one (a clone), is left alone. Several objectives have none (Optuna prunes
        on one). Within :data:`REPORT_EVERY` seconds of the last write nothing is written:
        the run's next report, or its tell, writes what was left."""
        if self.multi or time.monotonic() - self._reported_at < REPORT_EVERY:
            return
        self._reported_at = time.monotonic()
        values = _finite(chunk_values(history, self.metrics[0]))
        if not values:
            return
        with self._locked():
            trial = self._trial_of(history.name)
            if trial is None or trial.state.is_finished():
                return
            trial_id = self._trial_id(trial.number)
            for step, value in sorted(values.items()):
                if step not in trial.intermediate_values:
                    self.storage.set_trial_intermediate_value(trial_id, step, value)

    def tell(self, history: RunHistory, pruned_at_end: bool = False) -> str | None:
        """Tell the study how ``history``'s run ended, once: a completed run's last value
        of the metric (COMPLETE; PRUNED with ``pruned_at_end``, when the policy's pruner
        pruned it at its last report, as Optuna's loop in transformers'
        ``hyperparameter_search`` does: its sampler then sees the same trials), a stopped or
        deleted one's values so far (PRUNED), a failed one (FAIL); each chunk end's value as
        an intermediate value at its step.
        A run without a trial (a clone) is added as a trial of its own, when its knobs fit
        the search's distributions. Returns what was told, ``None`` if it was before."""
        optuna = self._optuna
        state_of = optuna.trial.TrialState
        finals = [_last_finite(chunk_values(history, m)) for m in self.metrics]
        finite = {} if self.multi else _finite(chunk_values(history, self.metrics[0]))
        last = finals[0]
        values: list[float] | None = None
        if (history.status == RunStatus.COMPLETED and pruned_at_end and not self.multi
                and last is not None):
            state = state_of.PRUNED
        elif history.status == RunStatus.COMPLETED and None not in finals:
            state, values = state_of.COMPLETE, [v for v in finals if v is not None]
        elif history.status in (RunStatus.STOPPED, RunStatus.DELETED) and any(
                v is not None for v in finals):
            state = state_of.PRUNED
        else:
            state = state_of.FAIL
        with self._locked():
            trial = self._trial_of(history.name)
            if trial is not None:
                if trial.state.is_finished():
                    return None
                for step, v in sorted(finite.items()):
                    if trial.intermediate_values.get(step) != v:
                        self.storage.set_trial_intermediate_value(
                            self._trial_id(trial.number), step, v)
                self.storage.set_trial_user_attr(self._trial_id(trial.number), "status",
                                                 history.status.value)
                self.study.sampler = self.sampler_for(trial.number)
                self._tell(trial.number, values, state)
                number = trial.number
            else:
                number = self._add(history, state, values, finite)
                if isinstance(number, str):
                    self._log("not told", history.name, "", number)
                    return f"not told: {number}"
            front = self._front() if self.multi and state == state_of.COMPLETE else None
        shown = values if values is not None else [last] if (
            state != state_of.FAIL and last is not None and not self.multi) else None
        told = state.name + ("" if shown is None else " " + ", ".join(f"{v:.6g}" for v in shown))
        if state == state_of.PRUNED and history.status == RunStatus.COMPLETED:
            told += " (completed; pruned at its last report)"
        self._log("told", history.name, number, told)
        if front is not None:
            self._log("front", "", "", " ".join(front))
        return f"trial {number}: {told}"

    def _tell(self, number: int, values: list[float] | None, state: Any) -> None:
        """``study.tell``, where a sampler that is done may call ``Study.stop()``: Optuna
        allows that only inside ``study.optimize`` and raises ``RuntimeError`` here, after
        storing the trial (in a ``finally``; Optuna's advice for ask-and-tell, issue 4121, is
        to catch it). The search then proposes nothing more, as ``optimize`` would stop."""
        with quiet_optuna():
            try:
                self.study.tell(number, values, state=state)
            except RuntimeError as err:
                if "Study.stop" not in str(err):
                    raise
                self.study.set_user_attr(SAMPLER_DONE, number)
                self._log("done", "", number, f"{self.sampler_name} stopped the study: every "
                          "point of its space was tried")

    def _front(self) -> list[str]:
        """The runs of the Pareto front: Optuna's best trials of a multi-objective study."""
        return [t.user_attrs.get("run", f"trial {t.number}") for t in self.study.best_trials]

    def _add(self, history: RunHistory, state: Any, final: list[float] | None,
             values: dict[int, float]) -> int | str:
        """A clone's result as a trial of its own; its number, or why it cannot be one."""
        optuna = self._optuna
        if self._trial_of(history.name) is not None:
            return "told before"
        written = self.space.params(dict(history.knobs))
        if isinstance(written, str):
            return written
        params, dists = written
        attrs = {"run": history.name, "status": history.status.value}
        if history.parent:
            attrs["clone_of"] = history.parent
        trial = optuna.trial.create_trial(params=params, distributions=dists, values=final,
                                          intermediate_values=values, user_attrs=attrs,
                                          state=state)
        self.study.add_trial(trial)
        self._scan()
        return self._numbers[history.name]

    # ------------------------------------------------------------------ the search log

    def _log(self, event: str, run: str, trial: Any, detail: str) -> None:
        """One row of ``search.csv``."""
        append_row(self.log_path, SEARCH_LOG_FIELDS, dict(zip(
            SEARCH_LOG_FIELDS, (f"{time.time():.3f}", event, run, trial, detail))))


def _finite(values: Mapping[int, float]) -> dict[int, float]:
    return {s: v for s, v in values.items() if v == v}


def _last_finite(values: Mapping[int, float]) -> float | None:
    """The value at the last chunk end with one that is not NaN."""
    finite = _finite(values)
    return finite[max(finite)] if finite else None
