"""The in-memory study an :class:`~.pruner.OptunaPruner` asks its pruner against.

Every run is a trial, numbered in the runs' creation order; its intermediate values are the
metric's value at each chunk end. :func:`replay` builds such a study from the runs' histories
at once: every run's values through the pruner in step order (the pruner's state, such as
``SuccessiveHalvingPruner``'s rung values, is rebuilt on the way), the question last. That is
what a decision cost before: O(N x history) a boundary.

:class:`PruningStudy` keeps the study instead and is told only what changed (the runs the
policy context says moved since the last look): each new value reported to its trial once,
each trial finished once, so a decision costs the values that arrived since the last one. It
gives the replay's answers because what the pruners it is used for keep is a function of each
trial's own values: ``MedianPruner`` and the other pruners that only read the study keep
nothing; ``SuccessiveHalvingPruner`` records a trial's value at the first report at or past
each rung, whichever trials came before. The one exception, two rungs passed within one chunk
(a "cascade": whether the upper rung records this value depends on the verdict at the lower,
so on the order the values arrived in), is found from the rungs and the chunk ends before any
value is reported, and such an experiment is answered by replay (:func:`cascades`). Anything
the study cannot take (a finished trial that trains again, a value that changed, a run that
would take a number below an existing trial's) rebuilds it by replay, as at start-up.
"""

from __future__ import annotations

import math
import re
import warnings
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any

from ...control.policies import RunHistory, chunk_values
from ...runtime.foreign_optuna import halving_rungs, with_resources
from ...shared_state.runs import RunStatus
from .support import quiet_optuna, require_optuna

__all__ = ["PruningStudy", "cascades", "replay", "trial_order"]

_STUDY = "trl-rapidfire"
_RUN_NUMBER = re.compile(r"run-(\d+)")


def trial_order(name: str) -> tuple[int, int, str]:
    """Runs in the order they were created, so a run keeps its trial number as runs are added
    (Hyperband draws a trial's bracket from its number)."""
    match = _RUN_NUMBER.fullmatch(name)
    return (0, int(match.group(1)), "") if match else (1, 0, name)


def _values(history: RunHistory, metric: str) -> dict[int, float]:
    """The run's intermediate values: its finite chunk-end values (none once deleted)."""
    if history.status == RunStatus.DELETED:
        return {}
    return {s: v for s, v in chunk_values(history, metric).items() if not math.isnan(v)}


def _final(status: RunStatus, values: Mapping[int, float], state: Any) -> tuple[Any, float | None]:
    """The Optuna trial state of a run in ``status`` and its value (Optuna gives a pruned
    trial its last intermediate value, as here)."""
    last = values[max(values)] if values else None
    if status == RunStatus.COMPLETED:
        return (state.COMPLETE, last) if last is not None else (state.FAIL, None)
    if status == RunStatus.STOPPED:
        return state.PRUNED, last
    if status.schedulable:
        return state.RUNNING, None
    return state.FAIL, None


def rung_steps(pruner: Any, last: int) -> list[int] | None:
    """The steps at which a successive-halving pruner records values, up to ``last``
    (Hyperband: every bracket's, the union); ``None`` for other pruners, or while a resource
    is still ``"auto"`` (Optuna's attributes are read in the wall, ``runtime.foreign_optuna``)."""
    rungs = halving_rungs(pruner)
    if rungs is None:
        return None
    low, factor = rungs
    if not isinstance(low, int) or not isinstance(factor, int) or low < 1 or factor < 2:
        return None
    steps = []
    while low <= last:
        steps.append(low)
        low *= factor
    return steps


def cascades(pruner: Any, ends: tuple[int, ...]) -> bool:
    """Whether a run reporting at the steps ``ends`` can pass two rungs in one report: its
    value then goes to the upper rung only if the lower promoted it, and that verdict depends
    on which values came before (see the module's doc)."""
    rungs = rung_steps(pruner, ends[-1]) if ends else None
    for lower, upper in zip(rungs or (), (rungs or [])[1:]):
        i = bisect_left(ends, lower)  # the report at or after the lower rung
        if i < len(ends) and upper <= ends[i]:
            return True
    return False


def resolve_auto(pruner: Any, runs: Iterable[RunHistory]) -> Any:
    """A copy of ``pruner`` with its ``"auto"`` resources set as Optuna sets them once a
    trial has completed, from the runs' planned last step: Optuna waits for a completed trial,
    which in interleaved training comes at the very end (and the study would then compare
    early values with other runs' final ones); the planned runs say now what it will be.
    ``pruner`` itself, the user's object, is never changed (the wall copies it)."""
    last = max((h.chunk_ends[-1] for h in runs if h.chunk_ends), default=0)
    return with_resources(pruner, last)


class PruningStudy:
    """One in-memory study for a pruner, told the runs' histories as they change.

    Args:
        pruner: the pruner this study feeds (changed: rung values, brackets).
        direction: ``minimize`` or ``maximize``.
        metric: the logged metric whose chunk-end values are the trials' values.
        stateful: the pruner keeps state in the study, so each reported value is passed to
            it, as ``trial.should_prune()`` does after each ``trial.report``.
    """

    def __init__(self, pruner: Any, direction: str, metric: str, stateful: bool) -> None:
        optuna = require_optuna("OptunaPruner")
        self.states = optuna.trial.TrialState  # public: replay() reads it too
        self.pruner, self.metric, self.stateful = pruner, metric, stateful
        self.storage = optuna.storages.InMemoryStorage()
        with quiet_optuna():
            self.study = optuna.create_study(storage=self.storage, study_name=_STUDY,
                                             pruner=pruner, direction=direction,
                                             sampler=optuna.samplers.RandomSampler(seed=0))
        self._study_id = self.storage.get_study_id_from_name(_STUDY)
        self._ids: dict[str, int] = {}
        self._last: tuple[int, int, str] | None = None  # the greatest trial_order so far
        self._fed: dict[str, dict[int, float]] = {}  # the values each trial holds
        self._finished: dict[str, tuple[Any, float | None]] = {}
        # Completed runs asked about their last value: whether the pruner pruned them there
        # (their trial is then PRUNED, as Optuna's loop leaves a trial pruned after its last
        # report; a median pruner, say, then leaves it out of its medians).
        self.judged: dict[str, bool] = {}
        self.prune_calls = 0  # how many times the pruner was asked (tests count them)
        self.trials_created = 0

    # ------------------------------------------------------------------ telling

    def add(self, history: RunHistory) -> bool:
        """A trial for a new run; ``False`` when it would take a number below an existing
        trial's (the study must be rebuilt)."""
        key = trial_order(history.name)
        if self._last is not None and key < self._last:
            return False
        self._last = key
        self._ids[history.name] = self.storage.create_new_trial(self._study_id)
        self.storage.set_trial_user_attr(self._ids[history.name], "run", history.name)
        self.trials_created += 1
        self._fed[history.name] = {}
        return True

    def knows(self, name: str) -> bool:
        """Whether the run has a trial."""
        return name in self._ids

    def reported(self, name: str) -> Mapping[int, float]:
        """The values the run's trial holds, by step."""
        return self._fed[name]

    def pending(self, history: RunHistory,
                hold: int | None = None) -> list[tuple[int, float]] | None:
        """The run's values the study has not had, in step order (``hold``: a step left out,
        the question's); ``None`` when the study cannot take them (a value changed or went,
        a value before one it has, a finished trial that changed)."""
        values = _values(history, self.metric)
        fed = self._fed[history.name]
        if any(values.get(s) != v for s, v in fed.items()):
            return None
        top = max(fed, default=0)
        new = sorted((s, v) for s, v in values.items() if s not in fed and s != hold)
        if new and new[0][0] < top:
            return None
        finished = self._finished.get(history.name)
        if finished is not None and (new or self.final_of(history) != finished):
            return None
        return new

    def final_of(self, history: RunHistory) -> tuple[Any, float | None]:
        """The trial state and value of ``history``'s run (:func:`_final`), PRUNED for a
        completed run the pruner pruned at its last value."""
        final = _final(history.status, _values(history, self.metric), self.states)
        if final[0] == self.states.COMPLETE and self.judged.get(history.name):
            return self.states.PRUNED, final[1]
        return final

    def feed(self, history: RunHistory, new: list[tuple[int, float]],
             asking: bool = False) -> None:
        """Report ``new`` (from :meth:`pending`) to the run's trial, each value passed to a
        stateful pruner, then finish the trial if the run has left the rotation (``asking``:
        the run's question comes next, and :meth:`settle` finishes it after)."""
        name = history.name
        verdict = False
        for step, value in new:
            self.report(name, step, value)
            if self.stateful:
                verdict = self.prune(name)  # it records the rungs
        if asking:
            return
        completed = history.status == RunStatus.COMPLETED
        if completed and new and name not in self.judged:
            # Its last value came in here: asked about it, as after a trial's last report.
            self.judged[name] = verdict if self.stateful else self.prune(name)
        self.settle(history)

    def settle(self, history: RunHistory) -> None:
        """Finish the run's trial if the run has left the rotation (once)."""
        if history.name not in self._finished:
            final = self.final_of(history)
            if final[0] != self.states.RUNNING:
                self.finish(history.name, final)

    def report(self, name: str, step: int, value: float) -> None:
        """``value`` at ``step`` reported to the run's trial, as ``trial.report`` does."""
        self.storage.set_trial_intermediate_value(self._ids[name], step, value)
        self._fed[name][step] = value

    def finish(self, name: str, final: tuple[Any, float | None]) -> None:
        state, value = final
        self.storage.set_trial_state_values(self._ids[name], state,
                                            None if value is None else [value])
        self._finished[name] = final

    def prune(self, name: str) -> bool:
        """Whether the pruner prunes the run's trial now, as ``trial.should_prune()`` asks."""
        self.prune_calls += 1
        return bool(self.pruner.prune(self.study, self.storage.get_trial(self._ids[name])))

    def ask(self, name: str, step: int, value: float, last: bool = False) -> bool:
        """The question: ``value`` at ``step`` reported to the run's trial, then whether the
        pruner prunes it (``last``: the run's last value, the verdict kept in
        :attr:`judged`)."""
        self.report(name, step, value)
        answer = self.prune(name)
        if last:
            self.judged[name] = answer
        return answer


def replay(pruner: Any, direction: str, metric: str, stateful: bool,
           runs: Mapping[str, RunHistory], question: tuple[str, int, float, bool] | None,
           verdicts: Mapping[str, bool] | None = None) -> tuple[PruningStudy, bool]:
    """A study built from the runs' histories at once: one trial per run in creation order,
    every value reported in step order (then by trial number) and passed to a stateful
    pruner (a completed run's last value to any pruner: its verdict there is kept), each
    trial finished after its last value; then the question (``run``, its step, its value,
    whether it is the run's last) last. ``verdicts``: completed runs' verdicts at their last
    value as they were given when it arrived (kept: the search was told them). Returns the
    study and the pruner's answer (``False`` without a question)."""
    book = PruningStudy(pruner, direction, metric, stateful)
    held = question[0] if question else None
    events: list[tuple[int, int, str, float]] = []
    last_event: dict[str, tuple[int, int]] = {}
    for number, history in enumerate(sorted(runs.values(), key=lambda h: trial_order(h.name))):
        book.add(history)
        values = _values(history, metric)
        if history.name == held:
            assert question is not None
            values.pop(question[1], None)  # the question comes last, after everyone else's
        events.extend((s, number, history.name, v) for s, v in values.items())
        if values:
            last_event[history.name] = (max(values), number)
    events.sort(key=lambda e: (e[0], e[1]))
    finals = {h.name: _final(h.status, _values(h, metric), book.states) for h in runs.values()}
    for name, final in finals.items():
        if name not in last_event and name != held and final[0] != book.states.RUNNING:
            book.finish(name, final)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the replay's answers are not the question's
        for step, number, name, value in events:
            book.report(name, step, value)
            # The question's run ends after its question (its last value may be it).
            last = last_event[name] == (step, number) and name != held
            completed = last and finals[name][0] == book.states.COMPLETE
            verdict = book.prune(name) if stateful or completed else False
            if completed:
                book.judged[name] = (verdicts or {}).get(name, verdict)
            if last and finals[name][0] != book.states.RUNNING:
                book.finish(name, book.final_of(runs[name]))
    answer = book.ask(*question) if question else False
    if held is not None:
        book.settle(runs[held])
    return book, answer
