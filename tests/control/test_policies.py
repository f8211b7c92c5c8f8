"""The policies' decisions on synthetic metric histories (no training)."""

from __future__ import annotations

import math

import pytest

from trl_rapidfire.control.policies import (
    Budget,
    Context,
    Decision,
    Policies,
    PopulationBased,
    RunHistory,
    SuccessiveHalving,
    as_policy,
    metric_at,
)
from trl_rapidfire.shared_state.runs import RunStatus

CHUNK = 10  # steps per chunk in every synthetic run


def run(name, values, total=8, status=RunStatus.RUNNING, metric="eval_loss", parent=None):
    """A run that logged ``values[i]`` at the end of its chunk i+1."""
    log = tuple({"step": CHUNK * (i + 1), metric: v} for i, v in enumerate(values))
    return RunHistory(name, status, len(values), total,
                      tuple(CHUNK * (i + 1) for i in range(total)), log, parent=parent)


def ctx(*runs, wall=0.0):
    return Context({r.name: r for r in runs}, wall)


def test_rungs_are_min_chunks_times_powers_of_eta():
    sh = SuccessiveHalving(eta=2, min_chunks=1)
    assert [c for c in range(1, 17) if sh.rung_of(c) is not None] == [1, 2, 4, 8, 16]
    sh3 = SuccessiveHalving(eta=3, min_chunks=2)
    assert [c for c in range(1, 40) if sh3.rung_of(c) is not None] == [2, 6, 18]


def test_a_run_continues_only_in_the_best_1_over_eta_of_its_rung():
    sh = SuccessiveHalving("eval_loss", "min", eta=2)
    first = run("a", [3.0])
    assert sh.on_chunk_end("a", ctx(first)) == []  # alone at the rung: the best of one
    second = run("b", [2.0], status=RunStatus.RUNNING)
    # b is best of two; a, still waiting at the rung, is judged again and is out.
    [d] = sh.on_chunk_end("b", ctx(first, second))
    assert (d.run, d.action) == ("a", "stop")
    assert d.reason == "rung 0: eval_loss 3 not in best 1/2 of 2 (1 better)"
    worst = run("c", [4.0])
    stopped_a = run("a", [3.0], status=RunStatus.STOPPED)
    [d] = sh.on_chunk_end("c", ctx(stopped_a, second, worst))
    assert (d.run, d.action) == ("c", "stop")  # a stopped there still counts as a peer
    assert d.reason == "rung 0: eval_loss 4 not in best 1/2 of 3 (2 better)"
    # Not a rung: nothing to decide.
    assert sh.on_chunk_end("x", ctx(run("x", [9.0, 9.0, 9.0]), second)) == []


def test_runs_still_to_reach_the_rung_count_so_nothing_synchronous_halving_keeps_is_stopped():
    sh = SuccessiveHalving(eta=2)
    # Four runs; the two that arrived are 2nd and 3rd best of the final four.
    arrived = [run("a", [2.0]), run("b", [3.0])]
    coming = [run("c", []), run("d", [])]
    assert sh.on_chunk_end("b", ctx(*arrived, *coming)) == []  # keep 2 of 4: both stay
    # The best arrives: b is now out (two better of four); a stays.
    c = run("c", [1.0])
    assert [(d.run, d.action) for d in sh.on_chunk_end("c", ctx(*arrived, c, coming[1]))] \
        == [("b", "stop")]
    # A run stopped before the rung will not come: the rung is three runs, keep one.
    gone = run("d", [], status=RunStatus.STOPPED)
    assert [(d.run, d.action) for d in sh.on_chunk_end("c", ctx(*arrived, c, gone))] \
        == [("a", "stop"), ("b", "stop")]


def test_synchronous_halving_on_one_worker_whatever_the_arrival_order():
    import random

    sh = SuccessiveHalving(eta=2)
    rng = random.Random(0)
    for trial in range(20):
        values = {f"r{i}": rng.choice([rng.random(), 0.5]) for i in range(16)}
        order = list(values)
        rng.shuffle(order)
        runs = {n: run(n, []) for n in values}
        stopped = set()
        for name in order:  # least progress first: everyone reaches rung 0 before chunk 2
            runs[name] = run(name, [values[name]])
            for d in sh.on_chunk_end(name, ctx(*runs.values())):
                assert d.action == "stop"
                stopped.add(d.run)
                runs[d.run] = run(d.run, [values[d.run]], status=RunStatus.STOPPED)
        cut = sorted(values.values())[7]  # the 8th best; ties with it stay
        assert stopped == {n for n, v in values.items() if v > cut}, trial


def test_a_run_that_left_its_rung_is_not_judged_again():
    sh = SuccessiveHalving(eta=2)
    moved_on = run("a", [3.0, 2.9])  # one chunk past rung 0 (and chunk 2 is rung 1)
    training = RunHistory("b", RunStatus.RUNNING, 1, 8, tuple(range(10, 90, 10)),
                          ({"step": 10, "eval_loss": 3.5},), training=True)
    best = run("c", [1.0])
    assert sh.on_chunk_end("c", ctx(moved_on, training, best)) == []


def test_mode_max_and_the_metric_without_its_eval_prefix():
    sh = SuccessiveHalving("accuracy", "max", eta=2)
    a, b = run("a", [0.9], metric="eval_accuracy"), run("b", [0.5], metric="eval_accuracy")
    assert [(d.run, d.action) for d in sh.on_chunk_end("a", ctx(a, b))] == [("b", "stop")]
    assert [(d.run, d.action) for d in sh.on_chunk_end("b", ctx(a, b))] == [("b", "stop")]


def test_ties_at_the_cut_off_all_continue():
    sh = SuccessiveHalving(eta=2)
    runs = [run(n, [1.0]) for n in "abcd"]
    assert all(sh.on_chunk_end(r.name, ctx(*runs)) == [] for r in runs)


def test_a_run_without_the_metric_yet_continues_and_nan_fails_it():
    sh = SuccessiveHalving(eta=2)
    silent = RunHistory("s", RunStatus.RUNNING, 1, 8, tuple(range(10, 90, 10)),
                        ({"step": 10, "loss": 2.0},))
    assert sh.on_chunk_end("s", ctx(silent, run("b", [0.1]))) == []
    [d] = sh.on_chunk_end("n", ctx(run("n", [math.nan]), run("b", [0.1])))
    assert d == Decision("n", "fail", "eval_loss is NaN at rung 0 (1 chunks)")
    # A NaN peer does not count against others.
    assert sh.on_chunk_end("b", ctx(run("n", [math.nan]), run("b", [5.0]))) == []


def test_clones_added_mid_flight_are_judged_against_what_reached_their_rung():
    sh = SuccessiveHalving(eta=2)
    old = [run("a", [1.0, 0.8, 0.7, 0.6]), run("b", [1.2, 1.0, 0.9, 0.8])]
    clone = run("c", [0.9], parent="a")  # reached rung 0 late: peers' values at chunk 1
    assert sh.on_chunk_end("c", ctx(*old, clone)) == []
    late = run("d", [1.5], parent="a")
    assert [d.action for d in sh.on_chunk_end("d", ctx(*old, clone, late))] == ["stop"]


def test_deleted_runs_and_finished_or_stopped_deciders_are_left_alone():
    sh = SuccessiveHalving(eta=2)
    deleted = run("x", [0.01], status=RunStatus.DELETED)
    assert sh.on_chunk_end("a", ctx(run("a", [1.0]), deleted)) == []
    done = run("z", [9.0, 9.0], total=2, status=RunStatus.COMPLETED)
    assert sh.on_chunk_end("z", ctx(done, run("a", [0.1, 0.1]))) == []


def test_metric_at_takes_the_last_value_by_the_chunk_end():
    h = RunHistory("a", RunStatus.RUNNING, 2, 4, (10, 20, 30, 40),
                   ({"step": 5, "eval_loss": 3.0}, {"step": 10, "eval_loss": 2.0},
                    {"step": 15, "eval_loss": 1.5}, {"step": 25, "eval_loss": 1.0}))
    assert metric_at(h, "eval_loss", 1) == 2.0
    assert metric_at(h, "loss", 2) == 1.5  # finds eval_loss
    assert metric_at(h, "eval_loss", 0) is None and metric_at(h, "eval_loss", 5) is None


def test_budget_stops_every_remaining_run_with_the_reason():
    runs = [run("a", [1.0, 1.0]), run("b", [1.0]), run("c", [1.0, 1.0], total=2,
                                                          status=RunStatus.COMPLETED)]
    # 20 + 10 + 20 = 50 steps trained: a budget of 50 is spent, one of 51 is not.
    assert len(Budget(max_total_steps=50).on_chunk_end("a", ctx(*runs))) == 2
    assert Budget(max_total_steps=51).on_chunk_end("a", ctx(*runs)) == []
    by_steps = Budget(max_total_steps=40)
    decisions = by_steps.on_chunk_end("a", ctx(*runs))
    assert [(d.run, d.action) for d in decisions] == [("a", "stop"), ("b", "stop")]
    assert decisions[0].reason == "budget spent: 50 of 40 steps"
    by_time = Budget(max_wall_seconds=60)
    assert by_time.on_chunk_end("a", ctx(*runs, wall=59.0)) == []
    assert by_time.on_chunk_end("a", ctx(*runs, wall=61.0))[0].reason == \
        "budget spent: 61 s of 60 s"


def test_several_policies_give_each_run_one_decision():
    both = as_policy([Budget(max_total_steps=1), SuccessiveHalving(eta=2)])
    assert isinstance(both, Policies)
    runs = [run("a", [1.0]), run("b", [2.0])]
    decisions = both.on_chunk_end("b", ctx(*runs))
    assert [(d.run, d.reason.split(":")[0], d.by) for d in decisions] == [
        ("a", "budget spent", "Budget"), ("b", "budget spent", "Budget")]


@pytest.mark.parametrize("make, match", [
    (lambda: SuccessiveHalving(mode="lowest"), "mode must be"),
    (lambda: SuccessiveHalving(eta=1), "eta must be"),
    (lambda: SuccessiveHalving(min_chunks=0), "min_chunks must be"),
    (lambda: Budget(), "needs max_wall_seconds"),
    (lambda: Budget(max_total_steps=-3), "max_total_steps must be"),
    (lambda: as_policy("asha"), "policy must be a Policy"),
])
def test_bad_settings_are_clear_errors(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_population_based_replaces_the_bottom_by_a_mutated_warm_clone_of_the_top():
    from trl_rapidfire import List

    pbt = PopulationBased("eval_loss", "min", interval_chunks=2, quantile=0.25,
                          mutations={"learning_rate": 2.0, "warmup_steps": List([0, 5])},
                          seed=1)

    def member(name, values, lr):
        h = run(name, values)
        return RunHistory(h.name, h.status, h.chunks_done, h.chunks_total, h.chunk_ends,
                          h.log, {"learning_rate": lr, "warmup_steps": 0})

    pop = [member("a", [3, 2.0], 1e-3), member("b", [3, 1.0], 3e-3),
           member("c", [3, 2.5], 1e-4), member("d", [3, 4.0], 1e-5)]
    assert pbt.on_chunk_end("a", ctx(*pop)) == []  # not in the bottom quarter
    stop, clone = pbt.on_chunk_end("d", ctx(*pop))
    assert (stop.run, stop.action) == ("d", "stop")
    assert stop.reason == "eval_loss 4 in the bottom 0.25 of 4 after 2 chunks"
    assert (clone.run, clone.action, clone.warm) == ("b", "clone", True)  # the top run
    assert clone.overrides["learning_rate"] in (6e-3, 1.5e-3)
    assert clone.overrides["warmup_steps"] in (0, 5)
    # The same question gives the same answer (a re-run, another worker).
    assert pbt.on_chunk_end("d", ctx(*pop)) == [stop, clone]
    # Off the interval, alone, without the metric, tied at the cut-off: nothing happens.
    assert pbt.on_chunk_end("x", ctx(member("x", [9.0], 1e-3), *pop)) == []
    assert pbt.on_chunk_end("d", ctx(pop[3])) == []
    tied = [member(n, [3, 5.0], 1e-3) for n in "pqr"] + [member("s", [3, 1.0], 1e-3)]
    assert pbt.on_chunk_end("p", ctx(*tied)) == []
    [fail] = pbt.on_chunk_end("n", ctx(member("n", [3, math.nan], 1e-3), *pop))
    assert fail.action == "fail" and "NaN" in fail.reason


@pytest.mark.parametrize("kwargs, match", [
    (dict(mutations={}), "needs mutations"),
    (dict(mutations={"learning_rate": 0.5}), "factor > 1"),
    (dict(mutations={"learning_rate": 2.0}, quantile=0.9), "quantile must be"),
    (dict(mutations={"learning_rate": 2.0}, interval_chunks=0), "interval_chunks must be"),
])
def test_population_based_bad_settings_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PopulationBased(**kwargs)


def test_a_clone_does_not_spare_its_parent_another_policys_stop():
    pbt = PopulationBased("eval_loss", interval_chunks=2, quantile=0.25,
                          mutations={"learning_rate": 2.0})
    pop = [run(n, [3, v]) for n, v in zip("abcd", (2.0, 1.0, 2.5, 4.0))]
    both = Policies([pbt, Budget(max_total_steps=1)])
    got = [(d.run, d.action) for d in both.on_chunk_end("d", ctx(*pop))]
    assert got == [("d", "stop"), ("b", "clone"), ("a", "stop"), ("b", "stop"), ("c", "stop")]
