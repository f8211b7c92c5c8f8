"""The policies' context kept up to date by the runs that moved: the same decisions as a
context rebuilt from every history, at a cost that does not grow with the number of runs."""

from __future__ import annotations

import random

import pytest

import trl_rapidfire.control.policies.base as base
from trl_rapidfire.control.policies import (
    Budget,
    Context,
    Hyperband,
    RunHistory,
    SuccessiveHalving,
    metric_at,
)
from trl_rapidfire.shared_state.runs import RunStatus

CHUNK = 4  # steps a chunk


def history(name, values, total, status=RunStatus.RUNNING, training=False):
    log = tuple({"step": CHUNK * (i + 1), "eval_loss": v} for i, v in enumerate(values))
    return RunHistory(name, status, len(values), total,
                      tuple(CHUNK * (i + 1) for i in range(total)), log, training=training)


def simulate(policy, n, total, seed, *, check_against_fresh=False, nan=True):
    """One worker, least progress first (the scheduler's rule): each boundary replaces the
    one run that moved in a kept context, asks the policy, and applies its stops. Returns the
    decisions in order and the largest number of ``metric_at`` calls one boundary made."""
    rng = random.Random(seed)
    quality = [rng.random() for _ in range(n)]
    values = {f"run-{i}": [] for i in range(n)}
    status = {name: RunStatus.PENDING for name in values}
    context = Context({name: history(name, [], total, RunStatus.PENDING) for name in values})
    decisions, most = [], 0
    while True:
        open_runs = [name for name in values
                     if status[name].schedulable and len(values[name]) < total]
        if not open_runs:
            return decisions, most
        name = min(open_runs, key=lambda r: (len(values[r]), int(r.split("-")[1])))
        chunk = len(values[name]) + 1
        values[name].append(quality[int(name.split("-")[1])] + 1.0 / chunk
                            + (float("nan") if nan and quality[int(name.split("-")[1])] > 0.97
                               else 0))
        status[name] = RunStatus.COMPLETED if chunk == total else RunStatus.RUNNING
        context.update([history(name, values[name], total, status[name])], 0.0)
        calls = count_metric_at()
        got = policy.on_chunk_end(name, context)
        most = max(most, calls.stop())
        if check_against_fresh:
            fresh = Context(dict(context.runs))
            assert got == type(policy)(**policy_args(policy)).on_chunk_end(name, fresh)
        moved = []
        for d in got:
            decisions.append((name, chunk, d.run, d.action))
            status[d.run] = RunStatus.STOPPED if d.action == "stop" else RunStatus.FAILED
            moved.append(history(d.run, values[d.run], total, status[d.run]))
        context.update(moved, 0.0)


def policy_args(policy):
    if isinstance(policy, Hyperband):
        return dict(metric=policy.metric, mode=policy.mode, eta=policy.eta,
                    min_chunks=policy.min_chunks)
    return dict(metric=policy.metric, mode=policy.mode, eta=policy.eta,
                min_chunks=policy.min_chunks)


class count_metric_at:
    """Counts ``metric_at`` calls (how much history a decision reads) until stopped."""

    def __init__(self):
        self.calls = 0
        self._patch = pytest.MonkeyPatch()
        original = base.metric_at

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        self._patch.setattr(base, "metric_at", counted)
        import trl_rapidfire.control.policies.successive_halving as sh
        self._patch.setattr(sh, "metric_at", counted)
        # A rung reads a run's value through its own import (policies/history.py's).
        import trl_rapidfire.control.policies.rungs as rungs
        self._patch.setattr(rungs, "metric_at", counted)

    def stop(self):
        self._patch.undo()
        return self.calls


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("seed", range(4))
def test_kept_context_decides_as_a_fresh_one(seed, mode):
    sh = SuccessiveHalving("eval_loss", mode, eta=2)
    decisions, _ = simulate(sh, 24, 8, seed, check_against_fresh=True)
    assert any(action == "stop" for *_, action in decisions)
    hb = Hyperband("eval_loss", mode, eta=2)
    decisions, _ = simulate(hb, 24, 8, seed, check_against_fresh=True)
    assert any(action == "stop" for *_, action in decisions)


def test_synchronous_halving_survivors_with_a_kept_context():
    # 32 runs, 8 chunks, eta 2, one worker: rungs 1, 2, 4 keep 16, 8, 4; 4 complete.
    decisions, _ = simulate(SuccessiveHalving(eta=2), 32, 8, seed=5, nan=False)
    stops = [(chunk, run) for _, chunk, run, action in decisions if action == "stop"]
    assert len(stops) == len({run for _, run in stops}) == 28
    assert [sum(1 for c, _ in stops if c == rung) for rung in (1, 2, 4)] == [16, 8, 4]


@pytest.mark.parametrize("policy", [SuccessiveHalving(eta=2), Hyperband(eta=2)],
                         ids=["halving", "hyperband"])
def test_a_decision_reads_as_much_history_at_256_runs_as_at_8(policy):
    # What a boundary reads does not grow with the number of runs (it grew with N: every
    # run's history was copied and scanned at every chunk end).
    _, at_8 = simulate(type(policy)(eta=2), 8, 16, seed=1)
    _, at_256 = simulate(type(policy)(eta=2), 256, 16, seed=1)
    assert at_256 <= at_8 + 2, (at_8, at_256)


def test_rung_index_follows_deleted_and_training_runs():
    runs = [history(f"run-{i}", [float(i)], 4) for i in range(6)]
    context = Context({h.name: h for h in runs})
    rung = context.rung("eval_loss", 1)
    assert (rung.arrived, rung.to_come) == (6, 0)
    assert rung.beaten_waiting(3) == ["run-3", "run-4", "run-5"]
    context.update([history("run-5", [5.0], 4, RunStatus.DELETED),
                    history("run-4", [4.0], 4, training=True),
                    history("run-6", [], 4, RunStatus.PENDING)], 1.0)
    assert (rung.arrived, rung.to_come) == (5, 1)
    assert rung.beaten_waiting(3) == ["run-3"]  # run-4 moved on, run-5 is gone
    assert rung.better_than(3.5) == 4 and rung.value_of("run-2") == 2.0
    assert metric_at(context.runs["run-2"], "eval_loss", 1) == 2.0


def test_total_steps_kept_up_to_date():
    context = Context({f"run-{i}": history(f"run-{i}", [1.0] * i, 4) for i in range(4)})
    assert context.total_steps == CHUNK * (0 + 1 + 2 + 3)
    context.update([history("run-0", [1.0, 1.0], 4)], 0.0)
    assert context.total_steps == CHUNK * (2 + 1 + 2 + 3)
    budget = Budget(max_total_steps=CHUNK * 8)
    assert {d.run for d in budget.on_chunk_end("run-0", context)} == {
        f"run-{i}" for i in range(4)}
    assert context.changed_since(0) == {"run-0"} and context.version == 1


def _pbt_reference(policy, run, context):
    """PopulationBased's rule written over every history, as it was before the index: the
    ranking of every run's value there, worst first, ties in the runs' order."""
    import math as _math

    me = context.runs[run]
    chunks = me.chunks_done
    if chunks % policy.interval or chunks >= me.chunks_total or not me.status.schedulable:
        return None
    mine = metric_at(me, policy.metric, chunks)
    if mine is None or _math.isnan(mine):
        return None
    values = {}  # every run's value there, deleted runs, NaN and missing values left out
    for other in context.runs.values():
        value = (metric_at(other, policy.metric, chunks)
                 if other.status != RunStatus.DELETED and other.chunks_done >= chunks else None)
        if value is not None and not _math.isnan(value):
            values[other.name] = value
    if len(values) < 2:
        return []
    cut = max(1, int(len(values) * policy.quantile))
    ordered = sorted(values.items(), key=lambda kv: kv[1], reverse=policy.mode == "min")
    boundary = ordered[cut][1]
    if not ((mine > boundary) if policy.mode == "min" else (mine < boundary)):
        return []
    return [name for name, _ in ordered[-cut:] if name != run]


@pytest.mark.parametrize("mode", ["min", "max"])
def test_population_based_ranks_as_a_pass_over_every_history(mode):
    from trl_rapidfire.control.policies import PopulationBased

    rng = random.Random(3)
    for trial in range(40):
        n = rng.randrange(2, 12)
        # Few distinct values: ties at the cut-off and among the donors.
        runs = [history(f"run-{i}", [float(rng.randrange(4)) for _ in range(2)], 6)
                for i in range(n)]
        context = Context({h.name: h for h in runs})
        pbt = PopulationBased("eval_loss", mode, interval_chunks=2, quantile=0.25,
                              mutations={"learning_rate": 2.0}, seed=trial)
        for h in runs:
            want = _pbt_reference(pbt, h.name, context)
            got = pbt.on_chunk_end(h.name, context)
            if not want:
                assert [d for d in got if d.action != "fail"] == [], (trial, h.name)
                continue
            stop, clone = got
            assert (stop.run, stop.action, clone.action) == (h.name, "stop", "clone")
            # The donor is drawn from the same list, in the same order, with the same seed.
            draw = pbt._rng(h.name, 2)
            assert clone.run == want[draw.randrange(len(want))], (trial, h.name)


def test_changed_since_names_the_runs_replaced_after_each_version():
    context = Context({f"run-{i}": history(f"run-{i}", [], 4) for i in range(3)})
    assert context.version == 0 and context.changed_since(0) == set()
    context.update([history("run-0", [1.0], 4), history("run-1", [1.0], 4)], 0.0)
    context.update([], 0.0)  # a boundary that replaced nothing still counts as a version
    context.update([history("run-2", [1.0], 4), history("run-0", [1.0, 2.0], 4)], 0.0)
    assert context.version == 3
    assert context.changed_since(0) == {"run-0", "run-1", "run-2"}
    assert context.changed_since(1) == {"run-2", "run-0"}
    assert context.changed_since(2) == {"run-2", "run-0"}
    assert context.changed_since(3) == set()
