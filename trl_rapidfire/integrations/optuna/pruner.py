"""Optuna's pruners as a policy: ``policy=OptunaPruner(optuna.pruners.MedianPruner())``.

An Optuna pruner decides from a trial's intermediate values (``trial.report(value, step)``) and
the other trials' values at the same step. Here every run is a trial and its intermediate values
are the metric it logged within each chunk, keyed by the global step at the chunk's end; at
every chunk end the pruner is asked about the run that just finished it, and "prune" becomes a
``stop`` in the op log, with the pruner's name in the reason.

How the pruners compare (read from Optuna's source, ``optuna/pruners/``):

* ``MedianPruner`` / ``PercentilePruner`` compare the run's *best* value so far with the
  median (percentile) of the values at the same step of the **COMPLETE** trials only, and do
  nothing while fewer than ``n_startup_trials`` trials are complete. Runs trained in
  interleaved chunks finish together at the end, so these prune only once some runs have
  finished: a later clone or a second wave of runs, not the first.
* ``SuccessiveHalvingPruner`` (ASHA) records a trial's value when it reaches a rung (a
  ``completed_rung_<k>`` system attribute) and keeps it if it is among the best
  ``1/reduction_factor`` of the values recorded at that rung *so far*, in any state: it decides
  on arrival, so early arrivals are compared with few runs and promoted generously.
  ``HyperbandPruner`` runs one such pruner per bracket over that bracket's trials only, a
  trial's bracket drawn from the study name and the trial number.
* ``ThresholdPruner``, ``PatientPruner`` and ``WilcoxonPruner`` (against the best COMPLETE
  trial) look at the run's own values.

Our :class:`~trl_rapidfire.control.policies.SuccessiveHalving` differs from Optuna's: it also
counts the
runs still to come in the rotation and judges a run waiting at a rung again when others
arrive, so on one worker its survivors are exactly synchronous successive halving's.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from typing import Any

from ...control.policies import Context, Decision, Policy, RunHistory, chunk_values
from ...shared_state.runs import RunStatus
from .support import quiet_optuna, require_optuna

__all__ = ["OptunaPruner"]

_STUDY = "trl-rapidfire"
_RUN_NUMBER = re.compile(r"run-(\d+)")


def _trial_order(history: RunHistory) -> tuple[int, int, str]:
    # Runs in the order they were created, so a run keeps its trial number as runs are added
    # (Hyperband draws a trial's bracket from its number).
    match = _RUN_NUMBER.fullmatch(history.name)
    return (0, int(match.group(1)), "") if match else (1, 0, history.name)


class OptunaPruner(Policy):
    """Any Optuna pruner, asked at every chunk end whether to stop the run that finished it.

    Stateless like the other policies: each call builds a fresh in-memory study from the
    runs' histories (one trial per run, numbered in the runs' creation order) and asks a copy
    of ``pruner``, so a re-run or another worker gets the same answer and the pruner given
    here is never changed. Pruners that keep state in the study (``SuccessiveHalvingPruner``,
    ``HyperbandPruner``, or any not known to be free of it) get it rebuilt by replaying every
    run's values through them in step order before the question; ``min_resource="auto"`` and
    ``max_resource="auto"`` are derived anew on each call from the runs complete by then, so
    give them explicitly (in steps) for brackets and rungs that stay put.

    Trials: a completed run is COMPLETE (its value: its last intermediate value; FAIL if it has
    none), a stopped run PRUNED, a pending or running run RUNNING, a failed run FAIL with its
    values and a deleted run FAIL without them (kept as trials so the numbering stays).

    Defined cases: a run that is not schedulable, is already training its next chunk, is at
    its last chunk, or logged no value within its latest chunk gets no decision; a NaN value in
    its latest chunk fails it, with the reason; NaN values in earlier chunks are left out.

    Args:
        pruner: an Optuna pruner (``optuna.pruners.MedianPruner()``, ...). Steps are global
            optimizer steps, so ``n_warmup_steps``, ``min_resource``, ... are in steps.
        metric: a logged metric (``eval_loss``, ``loss``, ...; ``x`` also finds ``eval_x``).
        direction: ``minimize`` or ``maximize``.

    Raises:
        OptunaMissing: Optuna is not installed.
    """

    def __init__(self, pruner: Any, metric: str = "eval_loss",
                 direction: str = "minimize") -> None:
        optuna = require_optuna("OptunaPruner")
        if not isinstance(pruner, optuna.pruners.BasePruner):
            raise TypeError(f"pruner must be an Optuna pruner (optuna.pruners.MedianPruner(), "
                            f"...), got {pruner!r}")
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be a non-empty string, got {metric!r}")
        self.pruner, self.metric, self.direction = pruner, metric, direction
        p = optuna.pruners
        # Exact types: these only read the study, so asking without a replay gives the same
        # answer; a subclass may keep state and gets the replay.
        self._replay = type(pruner) not in (p.MedianPruner, p.PercentilePruner,
                                            p.ThresholdPruner, p.NopPruner, p.WilcoxonPruner)

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        me = context.runs[run]
        chunks = me.chunks_done
        if (not me.status.schedulable or me.training or chunks >= me.chunks_total
                or not 0 < chunks <= len(me.chunk_ends)):
            return []
        step = me.chunk_ends[chunks - 1]
        mine = chunk_values(me, self.metric).get(step)
        if mine is None:
            return []
        if math.isnan(mine):
            return [Decision(run, "fail", f"{self.metric} is NaN at step {step} "
                                          f"({chunks} chunks)")]
        if not self._prune(run, step, mine, context):
            return []
        return [Decision(run, "stop", f"{type(self.pruner).__name__} pruned it at step {step} "
                                      f"({self.metric} {mine:.4g})")]

    def _prune(self, run: str, step: int, value: float, context: Context) -> bool:
        optuna = require_optuna("OptunaPruner")
        state = optuna.trial.TrialState
        pruner = copy.deepcopy(self.pruner)  # "auto" resources and brackets are set on use
        storage = optuna.storages.InMemoryStorage()
        with quiet_optuna():
            study = optuna.create_study(storage=storage, study_name=_STUDY, pruner=pruner,
                                        direction=self.direction,
                                        sampler=optuna.samplers.RandomSampler(seed=0))
        study_id = storage.get_study_id_from_name(_STUDY)
        ids: dict[str, int] = {}
        events: list[tuple[int, int, str, float]] = []
        finals: dict[str, tuple[Any, float | None]] = {}
        for number, h in enumerate(sorted(context.runs.values(), key=_trial_order)):
            ids[h.name] = storage.create_new_trial(study_id)
            storage.set_trial_user_attr(ids[h.name], "run", h.name)
            values = {} if h.status == RunStatus.DELETED else {
                s: v for s, v in chunk_values(h, self.metric).items() if not math.isnan(v)}
            if h.name == run:
                values.pop(step)  # the question comes last, after everyone else's values
            events.extend((s, number, h.name, v) for s, v in values.items())
            last = values[max(values)] if values else None
            finals[h.name] = _final_state(h.status, last, state)
            if not values:
                _finish(storage, ids[h.name], finals[h.name], state)
        events.sort(key=lambda e: (e[0], e[1]))
        last_event = {name: i for i, (_, _, name, _) in enumerate(events)}
        with quiet_optuna(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the replay's answers are not the question's
            for i, (s, _, name, v) in enumerate(events):
                storage.set_trial_intermediate_value(ids[name], s, v)
                if self._replay:
                    pruner.prune(study, storage.get_trial(ids[name]))
                if last_event[name] == i:
                    _finish(storage, ids[name], finals[name], state)
        storage.set_trial_intermediate_value(ids[run], step, value)
        with quiet_optuna():
            return bool(pruner.prune(study, storage.get_trial(ids[run])))


def _final_state(status: RunStatus, last: float | None, state: Any) -> tuple[Any, float | None]:
    """The Optuna trial state of a run in ``status`` and its value (Optuna gives a pruned
    trial its last intermediate value, as here)."""
    if status == RunStatus.COMPLETED:
        return (state.COMPLETE, last) if last is not None else (state.FAIL, None)
    if status == RunStatus.STOPPED:
        return state.PRUNED, last
    if status.schedulable:
        return state.RUNNING, None
    return state.FAIL, None


def _finish(storage: Any, trial_id: int, final: tuple[Any, float | None], state: Any) -> None:
    trial_state, value = final
    if trial_state != state.RUNNING:
        storage.set_trial_state_values(trial_id, trial_state,
                                       None if value is None else [value])
