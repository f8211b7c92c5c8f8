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

The study is kept between decisions and told only what changed since the last one (see
:mod:`.pruning_study`): a decision costs the values that arrived since the previous one, not
a replay of every run's history.

Our :class:`~trl_rapidfire.control.policies.SuccessiveHalving` differs from Optuna's: it also
counts the
runs still to come in the rotation and judges a run waiting at a rung again when others
arrive, so on one worker its survivors are exactly synchronous successive halving's.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from ...control.policies import Context, Decision, Policy, RunHistory, chunk_values
from ...runtime.foreign_optuna import halving_rungs
from ...shared_state.runs import RunStatus
from .pruning_study import PruningStudy, cascades, replay, resolve_auto, trial_order
from .support import require_optuna

__all__ = ["OptunaPruner"]


class OptunaPruner(Policy):
    """Any Optuna pruner, asked at every chunk end whether to stop the run that finished it.

    A function of the runs' histories like the other policies, so a re-run or another worker
    gets the same answer, and the pruner given here is never changed (a copy is used). The
    copy is asked against one in-memory study (one trial per run, numbered in the runs'
    creation order) that is built from the histories on the first decision, as a replay of
    every run's values in step order, and from then on told only the runs the
    :class:`~trl_rapidfire.control.policies.Context` says changed: each value reported and
    each trial finished once (:class:`~.pruning_study.PruningStudy`), with the replay's
    answers. A pruner that keeps state in the study other than these known ones (a subclass,
    ``PatientPruner``, your own) and an experiment where a successive-halving pruner's rungs
    are closer together than its chunks are answered by a fresh replay at every decision,
    as before. ``min_resource="auto"`` and ``max_resource="auto"`` are set on first use from
    the runs' planned last step, as Optuna sets them once a trial completes.

    Trials: a completed run is COMPLETE (its value: its last intermediate value; FAIL if it has
    none), a stopped run PRUNED, a pending or running run RUNNING, a failed run FAIL with its
    values and a deleted run FAIL without them (kept as trials so the numbering stays).

    A run's last value is asked about too, as Optuna's own loop asks ``should_prune()`` after
    a trial's last ``report()``: a run the pruner prunes there has trained to its end and stays
    completed, but its trial is PRUNED, here and in an :class:`OptunaSearch` study
    (:meth:`pruned_at_end`), as transformers' ``hyperparameter_search`` leaves it. The
    sampler then sees the trials it sees there.

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
        reading = (p.MedianPruner, p.PercentilePruner, p.ThresholdPruner, p.NopPruner,
                   p.WilcoxonPruner)
        self._stateful = type(pruner) not in reading
        # Pruners whose state in the study is a function of each trial's own values (see
        # pruning_study): the study can be told the runs in any order.
        self._incremental = not self._stateful or type(pruner) in (
            p.SuccessiveHalvingPruner, p.HyperbandPruner)
        self._template: Any = None  # the copy with "auto" resources set
        self._book: PruningStudy | None = None
        self._context: Context | None = None
        self._seen: Context | None = None  # the last context asked with (evaluates_at)
        self._version = 0
        self._grids: set[tuple[int, ...]] = set()  # chunk ends checked for cascades
        self.rebuilds = 0  # replays of every history (tests and benchmarks count them)
        self._at_end: dict[str, bool] = {}  # completed runs' verdicts at their last value
        self._spent = (0, 0)  # pruner calls and trials of the studies given up

    @property
    def stats(self) -> dict[str, int]:
        """What the decisions so far cost: ``prune_calls`` (the pruner asked, replays
        included), ``trials_created`` and ``rebuilds`` (replays of every history)."""
        calls, trials = self._spent
        if self._book is not None:
            calls, trials = calls + self._book.prune_calls, trials + self._book.trials_created
        return {"prune_calls": calls, "trials_created": trials, "rebuilds": self.rebuilds}

    def evaluates_at(self, run: str, chunks: int, chunks_total: int) -> bool:
        """Optuna's successive halving (and Hyperband, whose brackets are successive halvings)
        reads a trial's value only where the trial passes a rung step (``min_resource *
        reduction_factor**k``): with ``eval_strategy="policy"`` a run is evaluated at the
        chunk ends that pass one (and its last) and the pruner decides exactly as with a value
        at every chunk end. Any other pruner (the median pruner compares every step), an
        ``"auto"`` resource not set yet, or a run not seen yet: every chunk end."""
        if chunks >= chunks_total:
            return True
        grids = self._rung_grids()
        context = self._context or self._seen
        history = context.runs.get(run) if context is not None else None
        if grids is None or history is None or not 0 < chunks <= len(history.chunk_ends):
            return True
        start = history.chunk_ends[chunks - 2] if chunks > 1 else 0
        end = history.chunk_ends[chunks - 1]
        for first, factor in grids:
            rung = first
            while rung <= start:
                rung *= factor
            if rung <= end:
                return True
        return False

    def _rung_grids(self) -> list[tuple[int, int]] | None:
        """Each (first rung step, reduction factor) the pruner promotes at, or ``None`` when
        it reads other steps too (or a resource is still ``"auto"``)."""
        pruner = self._template if self._template is not None else self.pruner
        rungs = halving_rungs(pruner)  # Optuna keeps them in private names: read in the wall
        if rungs is None:
            return None
        first, factor = rungs
        if not isinstance(first, int) or not isinstance(factor, int) or first < 1 or factor < 2:
            return None
        # Hyperband's bracket b halves from min_resource * factor**b: together, every power.
        return [(first, factor)]

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        self._seen = context
        me = context.runs[run]
        chunks = me.chunks_done
        if chunks >= me.chunks_total and me.chunks_total:
            self._judge_end(run, context)
            return []
        if (not me.status.schedulable or me.training
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

    def pruned_at_end(self, run: str) -> bool | None:
        """Whether the pruner pruned the completed ``run`` at its last value, as Optuna's loop
        asks after a trial's last report (the search then records it PRUNED); ``None`` for a
        run whose last chunk end this policy has not seen."""
        return self._at_end.get(run)

    def _judge_end(self, run: str, context: Context) -> None:
        """The run trained its last chunk: ask the pruner about its last value once, as
        ``trial.should_prune()`` is asked after a trial's last ``trial.report``."""
        me = context.runs[run]
        if run in self._at_end:
            return
        step = me.chunk_ends[-1] if len(me.chunk_ends) == me.chunks_done else 0
        mine = chunk_values(me, self.metric).get(step) if step else None
        if (mine is None or math.isnan(mine) or me.training
                or me.status not in (RunStatus.COMPLETED, RunStatus.RUNNING)):
            self._at_end[run] = False
            return
        self._at_end[run] = self._prune(run, step, mine, context, last=True)

    def _prune(self, run: str, step: int, value: float, context: Context,
               last: bool = False) -> bool:
        if self._template is None:
            self._template = resolve_auto(self.pruner, context.runs.values())  # a copy
        question = (run, step, value, last)
        if not self._incremental:
            return self._rebuild(context, question, keep=False)
        book = self._book
        if book is None or context is not self._context:
            return self._rebuild(context, question)
        changed = context.changed_since(self._version)
        self._version = context.version
        changed.add(run)
        histories = sorted((context.runs[n] for n in changed if n in context.runs),
                           key=lambda h: trial_order(h.name))
        for history in histories:
            if not book.knows(history.name) and (self._cascades(history)
                                                 or not book.add(history)):
                return self._rebuild(context, question, keep=self._incremental)
        for history in histories:
            asking = history.name == run
            new = book.pending(history, step if asking else None)
            if new is None:
                return self._rebuild(context, question)
            book.feed(history, new, asking=asking)
        if len(context.runs) != book.trials_created:  # a run gone from the context
            return self._rebuild(context, question)
        if step in book.reported(run):  # asked about this boundary before
            return self._rebuild(context, question)
        answer = book.ask(run, step, value, last=last)
        book.settle(context.runs[run])
        return answer

    def _cascades(self, history: RunHistory) -> bool:
        """Check a new run's chunk ends: rungs closer than its chunks make the study's state
        depend on the order values arrive in, and the experiment is answered by replay."""
        if history.chunk_ends not in self._grids:
            self._grids.add(history.chunk_ends)
            rungs = halving_rungs(self._template)
            if self._stateful and (cascades(self._template, history.chunk_ends)
                                   or (rungs is not None and rungs[0] is None)):
                self._incremental = False
        return not self._incremental

    def _rebuild(self, context: Context, question: tuple[str, int, float, bool],
                 keep: bool = True) -> bool:
        """Replay every history into a new study and answer the question; ``keep``: the
        study is kept and told what changes from now on."""
        if keep:
            for history in context.runs.values():
                self._cascades(history)
        keep = keep and self._incremental
        self.rebuilds += 1
        old, self._book = self._book, None
        if old is not None:
            self._spent = (self._spent[0] + old.prune_calls, self._spent[1] + old.trials_created)
        book, answer = replay(copy.deepcopy(self._template), self.direction, self.metric,
                              self._stateful, context.runs, question, self._at_end)
        if keep:
            self._book, self._context, self._version = book, context, context.version
        else:
            self._spent = (self._spent[0] + book.prune_calls,
                           self._spent[1] + book.trials_created)
        return answer
