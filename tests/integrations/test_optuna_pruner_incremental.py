"""OptunaPruner keeps its study and is told what changed: the same decisions as a replay of
every history at every boundary, at a cost flat in the number of runs."""

from __future__ import annotations

import math
import random

import pytest

optuna = pytest.importorskip("optuna")

from trl_rapidfire.control.policies import Context, RunHistory  # noqa: E402
from trl_rapidfire.integrations.optuna.pruner import OptunaPruner  # noqa: E402
from trl_rapidfire.integrations.optuna.pruning_study import cascades  # noqa: E402
from trl_rapidfire.shared_state.runs import RunStatus  # noqa: E402

P = optuna.pruners
PENDING, RUNNING = RunStatus.PENDING, RunStatus.RUNNING
DONE, STOPPED = RunStatus.COMPLETED, RunStatus.STOPPED

def _asha(rng, chunk):
    kw = dict(min_resource=chunk * rng.choice([1, 2]), reduction_factor=rng.choice([2, 3, 4]),
              min_early_stopping_rate=rng.choice([0, 0, 1]))
    return lambda: P.SuccessiveHalvingPruner(**kw)


def _hyperband(rng, chunk):
    kw = dict(min_resource=chunk, max_resource=chunk * rng.choice([8, 16]),
              reduction_factor=rng.choice([2, 3]))
    return lambda: P.HyperbandPruner(**kw)


def _median(rng, chunk):
    kw = dict(n_startup_trials=rng.choice([1, 2, 3]), n_warmup_steps=rng.choice([0, chunk]))
    return lambda: P.MedianPruner(**kw)


# Each draws a pruner's settings and returns a function that makes it.
PRUNERS = {"asha": _asha, "hyperband": _hyperband, "median": _median}


def history(name, status, chunk, total, values, chunks=None):
    """A run that logged ``values[i]`` at the end of its chunk ``i + 1``."""
    done = len(values) if chunks is None else chunks
    log = tuple({"step": chunk * (i + 1), "eval_loss": v} for i, v in enumerate(values))
    return RunHistory(name, status, done, total, tuple(chunk * (i + 1) for i in range(total)),
                      log)


class Experiment:
    """Runs proposed ``at_a_time`` at a time, trained in interleaved chunks in a random
    order, their histories kept in one Context as the engine keeps it (``update`` with the run
    that moved); now and then a person stops, resumes or deletes a run, or a decision is not
    asked for (the run was already training its next chunk)."""

    def __init__(self, rng, runs, at_a_time, chunk, total, people=True):
        self.rng, self.runs, self.at_a_time = rng, runs, at_a_time
        self.chunk, self.total, self.people = chunk, total, people
        self.values: dict[str, list[float]] = {}
        self.status: dict[str, RunStatus] = {}
        self.context = Context({})
        self.clock = 0.0

    def _put(self, name):
        self.clock += 1
        self.context.update([history(name, self.status[name], self.chunk, self.total,
                                     self.values[name])], self.clock)

    def _propose(self):
        while (sum(s.schedulable for s in self.status.values()) < self.at_a_time
               and len(self.status) < self.runs):
            name = f"run-{len(self.status)}"
            self.status[name], self.values[name] = PENDING, []
            self._put(name)

    def steps(self):
        """Yields each run that has just finished a chunk, its history in the context."""
        self._propose()
        while True:
            live = [n for n, s in self.status.items() if s.schedulable]
            if not live:
                return
            name = self.rng.choice(live)
            c = len(self.values[name])
            base = 1 + (int(name.split("-")[1]) * 37 % 11) / 10
            value = base / math.sqrt(c + 1) + self.rng.random() * 0.2
            self.values[name].append(round(value, 2))  # ties happen
            self.status[name] = DONE if c + 1 == self.total else RUNNING
            self._put(name)
            yield name, self.rng.random() < 0.1  # sometimes not asked
            self._person()
            self._propose()

    def stop(self, name):
        self.status[name] = STOPPED
        self._put(name)

    def _person(self):
        if not self.people or self.rng.random() > 0.04:
            return
        name = self.rng.choice(list(self.status))
        status = self.status[name]
        if status == STOPPED and self.rng.random() < 0.5:
            self.status[name] = RUNNING  # resumed: a finished trial trains again
        elif status.schedulable:
            self.status[name] = self.rng.choice([STOPPED, RunStatus.DELETED, RunStatus.FAILED])
        else:
            return
        self._put(name)


@pytest.mark.parametrize("kind", sorted(PRUNERS))
@pytest.mark.parametrize("seed", range(6))
def test_the_same_decisions_as_a_fresh_replay_at_every_boundary(kind, seed):
    rng = random.Random(f"{kind}-{seed}")
    chunk = rng.choice([2, 5, 10])
    direction = rng.choice(["minimize", "maximize"])
    make = PRUNERS[kind](rng, chunk)
    experiment = Experiment(rng, runs=rng.choice([8, 14]), at_a_time=rng.choice([2, 3, 5]),
                            chunk=chunk, total=rng.choice([6, 8]), people=seed % 2 == 0)
    ours = OptunaPruner(make(), direction=direction)
    asked = pruned = ended = 0
    for name, skip in experiment.steps():
        if skip:
            continue
        context = experiment.context
        mine = ours.on_chunk_end(name, context)
        # A fresh pruner is what a re-run (or a replay) asks: its verdict on a run's last
        # value too must be the live one's.
        reference = OptunaPruner(make(), direction=direction)
        fresh = reference.on_chunk_end(name, Context(dict(context.runs)))
        assert mine == fresh, (name, context.runs[name])
        assert ours.pruned_at_end(name) == reference.pruned_at_end(name), name
        ended += reference.pruned_at_end(name) is not None
        asked += 1
        if mine and mine[0].action == "stop":
            pruned += 1
            experiment.stop(name)
    assert asked > 10 and ended > 0
    if kind != "median":
        assert pruned > 0  # the comparison is between decisions, not only empty answers
    # Incremental: one replay to start, and one for each person's op that changed the past
    # (a stopped run resumed, a run deleted), never one a boundary.
    assert ours.stats["rebuilds"] <= 3 < asked


def test_rungs_closer_than_a_chunk_are_answered_by_replay():
    # Rungs at 2, 4, 8 ...: a chunk of 5 steps passes 2 and 4 in one report.
    close = P.SuccessiveHalvingPruner(min_resource=2, reduction_factor=2)
    assert cascades(close, (5, 10, 15, 20))
    assert not cascades(close, (2, 4, 6, 8))
    assert not cascades(P.SuccessiveHalvingPruner(min_resource=5, reduction_factor=2),
                        (5, 10, 15, 20))
    assert not cascades(P.MedianPruner(), (5, 10))
    rng = random.Random(0)
    experiment = Experiment(rng, runs=8, at_a_time=2, chunk=5, total=6, people=False)
    ours = OptunaPruner(close)
    asked = 0
    for name, _ in experiment.steps():
        asked += len(experiment.values[name]) < experiment.total
        mine = ours.on_chunk_end(name, experiment.context)
        fresh = OptunaPruner(P.SuccessiveHalvingPruner(min_resource=2, reduction_factor=2)
                             ).on_chunk_end(name, Context(dict(experiment.context.runs)))
        assert mine == fresh
        if mine:
            experiment.stop(name)
    # One a decision, and one for each run's last value (whether it was pruned there).
    ends = sum(ours.pruned_at_end(name) is not None for name in experiment.values)
    assert asked > 10 and ends > 0 and ours.stats["rebuilds"] == asked + ends


@pytest.mark.parametrize("kind", ["asha", "median"])
def test_pruner_calls_and_trials_a_boundary_are_flat_in_the_number_of_runs(kind):
    """O(changes): at 8 and at 256 runs, each boundary asks the pruner about the values that
    arrived since the last one and creates a trial per new run, once; one replay, at the
    start."""
    def cost(runs):
        rng = random.Random(1)
        pruner = (P.SuccessiveHalvingPruner(min_resource=2, reduction_factor=2)
                  if kind == "asha" else P.MedianPruner(n_startup_trials=2))
        experiment = Experiment(rng, runs=runs, at_a_time=4, chunk=2, total=8, people=False)
        ours = OptunaPruner(pruner)
        boundaries = 0
        for name, _ in experiment.steps():
            boundaries += 1
            if ours.on_chunk_end(name, experiment.context):
                experiment.stop(name)
        return ours.stats, boundaries

    (small, asked8), (big, asked256) = cost(8), cost(256)
    assert asked256 > 5 * asked8
    for stats, runs, boundaries in ((small, 8, asked8), (big, 256, asked256)):
        assert stats["rebuilds"] == 1
        assert stats["trials_created"] == runs  # each run's trial once (the replay's included)
        # ASHA: each value passed to the pruner once (the question's, or as it is told);
        # Median: only the questions (it reads the study).
        assert stats["prune_calls"] <= boundaries
    per_boundary = [s["prune_calls"] / a for s, a in ((small, asked8), (big, asked256))]
    assert per_boundary[1] <= max(per_boundary[0], 1.0) + 1e-9


def test_a_rerun_after_a_crash_gets_the_same_answers():
    """A new pruner (a re-run) replays the histories once, at its first decision, and then
    decides as the pruner that kept going."""
    rng = random.Random(3)
    experiment = Experiment(rng, runs=12, at_a_time=3, chunk=2, total=8, people=False)
    make = lambda: P.HyperbandPruner(min_resource=2, max_resource=16, reduction_factor=2)  # noqa: E731
    kept, restarted = OptunaPruner(make()), None
    answers = []
    for i, (name, _) in enumerate(experiment.steps()):
        if i == 25:
            restarted = OptunaPruner(make())
        mine = kept.on_chunk_end(name, experiment.context)
        if restarted is not None:
            assert restarted.on_chunk_end(name, experiment.context) == mine
        answers.append(bool(mine))
        if mine:
            experiment.stop(name)
    assert any(answers) and restarted is not None and restarted.stats["rebuilds"] == 1


def test_auto_resources_are_set_from_the_planned_runs():
    """``min_resource="auto"`` is what Optuna derives once a trial completes (the last
    step // 100, at least 1): the runs' plan says it before any completes, so the first runs
    are judged at their first rung too, and the pruner given is left alone."""
    pruner = P.SuccessiveHalvingPruner(reduction_factor=2)
    ours = OptunaPruner(pruner)
    runs = {f"run-{i}": history(f"run-{i}", RUNNING, 4, 100, [v])  # 400 steps: rungs 4, 8, ..
            for i, v in enumerate([3.0, 1.0, 2.0, 4.0])}
    context = Context(runs)
    # At rung 0 (step 4) with all four values: the best half (1.0, 2.0) is kept.
    assert [bool(ours.on_chunk_end(n, context)) for n in runs] == [True, False, False, True]
    assert pruner._min_resource is None and ours._template._min_resource == 4
