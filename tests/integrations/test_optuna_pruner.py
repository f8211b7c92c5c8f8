"""OptunaPruner's decisions on synthetic metric histories (no training)."""

from __future__ import annotations

import math
import pickle
import statistics
import sys
from dataclasses import replace

import pytest

optuna = pytest.importorskip("optuna")

from trl_rapidfire.control.policies import (  # noqa: E402
    Budget,
    Context,
    Decision,
    Policies,
    RunHistory,
    as_policy,
)
from trl_rapidfire.integrations.optuna.pruner import OptunaPruner  # noqa: E402
from trl_rapidfire.integrations.optuna.support import OptunaMissing  # noqa: E402
from trl_rapidfire.shared_state.runs import RunStatus  # noqa: E402

P = optuna.pruners
CHUNK = 10  # steps per chunk in every synthetic run
DONE, RUNNING, STOPPED = RunStatus.COMPLETED, RunStatus.RUNNING, RunStatus.STOPPED


def run(name, values, total=8, status=RUNNING, metric="eval_loss"):
    """A run that logged ``values[i]`` at the end of its chunk i+1 (``None``: nothing)."""
    log = tuple({"step": CHUNK * (i + 1), metric: v}
                for i, v in enumerate(values) if v is not None)
    return RunHistory(name, status, len(values), total,
                      tuple(CHUNK * (i + 1) for i in range(total)), log)


def ctx(*runs):
    return Context({r.name: r for r in runs})


def median_rule_prunes(mine, peers_at_step):
    """The median stopping rule by hand: the run's best value so far is worse than the median
    of the completed runs' values at its latest step."""
    return min(mine) > statistics.median(peers_at_step)


COMPLETED = [run("run-0", [2.0, 1.5], total=2, status=DONE),
             run("run-1", [3.0, 2.0], total=2, status=DONE),
             run("run-2", [4.0, 3.0], total=2, status=DONE)]


@pytest.mark.parametrize("values", [[3.5], [2.5], [1.9, 2.2], [2.5, 2.2], [3.0]])
def test_median_pruner_stops_a_run_worse_than_the_completed_runs_median(values):
    policy = OptunaPruner(P.MedianPruner(n_startup_trials=3), "eval_loss", "minimize")
    step = CHUNK * len(values)
    peers = [c.log[len(values) - 1]["eval_loss"] for c in COMPLETED]
    decisions = policy.on_chunk_end("run-3", ctx(*COMPLETED, run("run-3", values)))
    if median_rule_prunes(values, peers):
        assert decisions == [Decision("run-3", "stop", f"MedianPruner pruned it at step {step} "
                                                       f"(eval_loss {values[-1]:.4g})")]
    else:
        assert decisions == []


def test_median_pruner_judges_against_completed_runs_only():
    policy = OptunaPruner(P.MedianPruner(n_startup_trials=0))
    peers = [run(f"run-{i}", [v]) for i, v in enumerate((1.0, 2.0, 3.0))]
    worst = run("run-3", [9.0])
    assert policy.on_chunk_end("run-3", ctx(*peers, worst)) == []  # nobody finished yet
    finished = [replace(p, status=DONE, chunks_total=1) for p in peers]
    [d] = policy.on_chunk_end("run-3", ctx(*finished, worst))
    assert d.reason == "MedianPruner pruned it at step 10 (eval_loss 9)"
    # n_startup_trials counts completed runs: two of three are not enough.
    three = OptunaPruner(P.MedianPruner(n_startup_trials=3))
    assert three.on_chunk_end("run-3", ctx(*finished[:2], peers[2], worst)) == []


def test_maximize_and_the_metric_without_its_eval_prefix():
    policy = OptunaPruner(P.MedianPruner(n_startup_trials=1), "accuracy", "maximize")
    done = run("run-0", [0.8], total=1, status=DONE, metric="eval_accuracy")
    assert policy.on_chunk_end("run-1", ctx(done, run("run-1", [0.9],
                                                      metric="eval_accuracy"))) == []
    [d] = policy.on_chunk_end("run-1", ctx(done, run("run-1", [0.7], metric="eval_accuracy")))
    assert d.reason == "MedianPruner pruned it at step 10 (accuracy 0.7)"


def test_the_value_is_the_last_one_logged_within_the_chunk():
    policy = OptunaPruner(P.ThresholdPruner(upper=2.0))

    def logged(*entries):
        return RunHistory("run-0", RUNNING, 2, 4, (10, 20, 30, 40), entries)

    # Mid-chunk evaluations: the last one in (10, 20] counts; step 0 belongs to no chunk.
    better_last = logged({"step": 0, "eval_loss": 9.0}, {"step": 14, "eval_loss": 2.31459},
                         {"step": 20, "eval_loss": 1.0})
    assert policy.on_chunk_end("run-0", ctx(better_last)) == []
    worse_last = logged({"step": 14, "eval_loss": 1.0}, {"step": 18, "eval_loss": 2.31459})
    [d] = policy.on_chunk_end("run-0", ctx(worse_last))
    assert d.reason == "ThresholdPruner pruned it at step 20 (eval_loss 2.315)"
    # A value from an earlier chunk is not the latest chunk's: nothing to decide.
    assert policy.on_chunk_end("run-0", ctx(logged({"step": 10, "eval_loss": 9.0}))) == []


def test_no_decision_at_the_last_chunk_while_training_when_stopped_or_without_the_metric():
    policy = OptunaPruner(P.ThresholdPruner(upper=2.0))
    assert [d.action for d in policy.on_chunk_end("run-0", ctx(run("run-0", [9.0])))] \
        == ["stop"]  # the baseline: each case below would be stopped otherwise
    last = run("run-0", [9.0] * 8, total=8)
    training = replace(run("run-0", [9.0]), training=True)
    stopped = run("run-0", [9.0], status=STOPPED)
    silent = RunHistory("run-0", RUNNING, 1, 8, tuple(range(10, 90, 10)),
                        ({"step": 10, "loss": 9.0},))
    not_this_chunk = run("run-0", [9.0, None])
    for history in (last, training, stopped, silent, not_this_chunk):
        assert policy.on_chunk_end("run-0", ctx(history)) == [], history


def test_nan_at_the_latest_chunk_fails_the_run_and_earlier_nans_are_left_out():
    policy = OptunaPruner(P.MedianPruner(n_startup_trials=1))
    assert policy.on_chunk_end("run-3", ctx(*COMPLETED, run("run-3", [math.nan]))) == [
        Decision("run-3", "fail", "eval_loss is NaN at step 10 (1 chunks)")]
    # Earlier NaN: judged on its other values (2.5 > median 2.0 at step 20).
    [d] = policy.on_chunk_end("run-3", ctx(*COMPLETED, run("run-3", [math.nan, 2.5])))
    assert (d.action, d.reason) == ("stop", "MedianPruner pruned it at step 20 (eval_loss 2.5)")
    # A peer's NaN does not count against others.
    nan_peer = run("run-4", [math.nan], total=1, status=DONE)
    assert policy.on_chunk_end("run-3", ctx(*COMPLETED, nan_peer, run("run-3", [1.0]))) == []


def population():
    """Twelve runs at various stages (values fall with chunks, spread by run)."""
    runs = []
    for i in range(12):
        chunks = 8 if i < 3 else 1 + i % 5
        values = [2.0 + 0.1 * ((i * 7) % 12) - 0.1 * c for c in range(chunks)]
        runs.append(run(f"run-{i}", values, status=DONE if chunks == 8 else RUNNING))
    return runs


def decisions_for_all(policy, context):
    return {name: policy.on_chunk_end(name, context) for name in context.runs}


def test_decisions_are_a_function_of_the_context_and_numbering_follows_the_run_index():
    pruner = P.HyperbandPruner(min_resource=CHUNK, max_resource=8 * CHUNK, reduction_factor=2)
    before = pickle.dumps(pruner)
    policy = OptunaPruner(pruner)
    runs = population()
    first = decisions_for_all(policy, ctx(*runs))
    assert any(first.values())  # the comparison below is not between empty answers
    assert decisions_for_all(policy, ctx(*runs)) == first
    # A new run (its index after the others), listed first; and the listing reversed: every
    # run keeps its trial number, so its Hyperband bracket and its answer.
    newcomer = run("run-12", [], status=RunStatus.PENDING)
    again = decisions_for_all(policy, ctx(newcomer, *reversed(runs)))
    assert again.pop("run-12") == [] and again == first
    # Pruners that set themselves up on first use ("auto" resources) are used as copies.
    auto = P.HyperbandPruner(min_resource=CHUNK, reduction_factor=2)
    auto_before = pickle.dumps(auto)
    decisions_for_all(OptunaPruner(auto), ctx(*runs))
    assert pickle.dumps(pruner) == before and pickle.dumps(auto) == auto_before


def asha_keeps(value, at_rung, reduction_factor):
    """ASHA by hand: among the values recorded at the rung so far, the best
    ``max(1, n // reduction_factor)`` are promoted (ties with the cut-off too)."""
    keep = max(1, len(at_rung) // reduction_factor)
    return value <= sorted(at_rung)[keep - 1]


def test_successive_halving_pruner_decides_on_arrival():
    policy = OptunaPruner(P.SuccessiveHalvingPruner(min_resource=CHUNK, reduction_factor=2))
    values = {"run-0": 3.0, "run-1": 2.0, "run-2": 2.5, "run-3": 4.0}  # in arrival order
    names = list(values)
    status = {n: RUNNING for n in names}
    stopped = []
    for k, name in enumerate(names, 1):
        arrived = [run(n, [values[n]], status=status[n]) for n in names[:k]]
        coming = [run(n, [], status=RunStatus.PENDING) for n in names[k:]]
        decisions = policy.on_chunk_end(name, ctx(*arrived, *coming))
        expected = not asha_keeps(values[name], [values[n] for n in names[:k]], 2)
        assert bool(decisions) == expected, name
        if decisions:
            assert decisions == [Decision(name, "stop", f"SuccessiveHalvingPruner pruned it at "
                                                        f"step 10 (eval_loss {values[name]:g})")]
            status[name] = STOPPED  # a pruned run still counts at its rung
            stopped.append(name)
    # The first arrival stays although it ends up worse than the median: ASHA's generosity.
    assert stopped == ["run-2", "run-3"]


@pytest.mark.parametrize("make, error, match", [
    (lambda: OptunaPruner("median"), TypeError, "pruner must be an Optuna pruner"),
    (lambda: OptunaPruner(P.MedianPruner(), direction="min"), ValueError, "direction must be"),
    (lambda: OptunaPruner(P.MedianPruner(), metric=""), ValueError, "metric must be"),
])
def test_bad_settings_are_clear_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_without_optuna_the_error_names_the_extra(monkeypatch):
    pruner = P.MedianPruner()
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    with pytest.raises(OptunaMissing, match=r"pip install optuna .*pip install -e '\.\[optuna\]'"):
        OptunaPruner(pruner)


def test_combined_with_budget_each_decision_names_its_policy():
    both = as_policy([OptunaPruner(P.MedianPruner(n_startup_trials=1)),
                      Budget(max_total_steps=1)])
    assert isinstance(both, Policies) and both.policies[0].name == "OptunaPruner"
    worst, other = run("run-3", [9.0]), run("run-4", [1.0])
    decisions = both.on_chunk_end("run-3", ctx(*COMPLETED, worst, other))
    assert [(d.run, d.action, d.by) for d in decisions] == [
        ("run-3", "stop", "OptunaPruner"), ("run-4", "stop", "Budget")]
    assert decisions[0].reason == "MedianPruner pruned it at step 10 (eval_loss 9)"


@pytest.mark.parametrize("make", [
    lambda: P.SuccessiveHalvingPruner(min_resource=CHUNK, reduction_factor=2),
    lambda: P.HyperbandPruner(min_resource=CHUNK, max_resource=8 * CHUNK, reduction_factor=2),
    lambda: P.MedianPruner(n_startup_trials=1),
], ids=["asha", "hyperband", "median"])
@pytest.mark.parametrize("seed", range(4))
def test_the_same_answers_as_optunas_own_report_and_should_prune_loop(make, seed):
    """Two waves of runs trained in interleaved chunks, each chunk's value reported to an
    Optuna trial as it comes and ``should_prune()`` asked after each report, the last one
    too (a trial pruned there ends PRUNED, as in transformers' ``hyperparameter_search``):
    rebuilt from the histories, the answers are Optuna's, at the last value as
    ``pruned_at_end``."""
    import random

    rng = random.Random(seed)
    chunks, names = 8, [f"run-{i}" for i in range(10)]
    values = {n: [rng.random() + 1 / (c + 1) for c in range(chunks)] for n in names}
    study = optuna.create_study(study_name="trl-rapidfire", pruner=make(),
                                storage=optuna.storages.InMemoryStorage())
    trials = {n: study.ask() for n in names}
    policy = OptunaPruner(make())
    done, status = dict.fromkeys(names, 0), dict.fromkeys(names, RunStatus.PENDING)
    for wave in (names[:4], names[4:]):
        for c in range(chunks):
            for n in wave:
                if not status[n].schedulable:
                    continue
                done[n], status[n] = c + 1, RUNNING
                trials[n].report(values[n][c], CHUNK * (c + 1))
                context = ctx(*(run(m, values[m][:done[m]], chunks, status[m]) for m in names))
                ours = policy.on_chunk_end(n, context)
                theirs = trials[n].should_prune()
                last = c == chunks - 1
                assert bool(ours) == (theirs and not last), (n, c)  # no stop at the end
                assert policy.pruned_at_end(n) == (theirs if last else None), (n, c)
                if theirs:
                    study.tell(trials[n], state=optuna.trial.TrialState.PRUNED)
                    status[n] = DONE if last else STOPPED
                elif last:
                    study.tell(trials[n], values[n][c])
                    status[n] = DONE
