"""Hyperband's brackets and decisions on synthetic histories, and once in real training."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import zlib
from collections import Counter
from dataclasses import replace

import pytest

from trl_rapidfire.control.policies import (
    Context,
    Decision,
    Hyperband,
    RunHistory,
    SuccessiveHalving,
    metric_at,
)
from trl_rapidfire.shared_state.runs import RunStatus

CHUNK = 10  # steps per chunk in every synthetic run

# eta=2, 8 chunks: 4 brackets with Li et al.'s shares ceil(4 * 2**(3-b) / (4-b)) = 8, 6, 4, 4
# (22 places a cycle). Places by (2k+1)/(2 n_b): bracket 0 at 1/16, 3/16, ...; bracket 1 at
# 1/12, 3/12, ...; brackets 2 and 3 at 1/8, 3/8, ... (ties: the smaller bracket first).
CYCLE_2_8 = [0, 1, 2, 3, 0, 1, 0, 2, 3, 1, 0, 0, 1, 2, 3, 0, 1, 0, 2, 3, 1, 0]
# eta=3, 9 chunks: 3 brackets, shares ceil(3 * 3**(2-b) / (3-b)) = 9, 5, 3 (17 places).
CYCLE_3_9 = [0, 1, 0, 2, 0, 1, 0, 0, 1, 2, 0, 1, 0, 0, 2, 1, 0]


def run(name, values, total=8, status=RunStatus.RUNNING, parent=None):
    """A run that logged eval loss ``values[i]`` at the end of its chunk i+1."""
    log = tuple({"step": CHUNK * (i + 1), "eval_loss": v} for i, v in enumerate(values))
    return RunHistory(name, status, len(values), total,
                      tuple(CHUNK * (i + 1) for i in range(total)), log, parent=parent)


def ctx(*runs):
    return Context({r.name: r for r in runs})


def names(n):
    return [f"run-{i}" for i in range(n)]


# --- brackets --------------------------------------------------------------------------------

def test_64_runs_split_in_hyperbands_shares_by_their_number():
    hb = Hyperband(eta=2)
    assert [hb.bracket_of(n, 8) for n in names(22)] == CYCLE_2_8
    # 64 = 2 cycles + the first 20 places (7, 5, 4, 4 of them).
    split = hb.brackets_of(names(64), 8)
    assert {b: len(runs) for b, runs in split.items()} == {0: 23, 1: 17, 2: 12, 3: 12}
    assert split[3][:3] == ["run-3", "run-8", "run-14"]
    hb3 = Hyperband(eta=3)
    assert [hb3.bracket_of(n, 9) for n in names(17)] == CYCLE_3_9
    # 64 = 3 cycles (27, 15, 9) + the first 13 places (7, 4, 2).
    assert Counter(hb3.bracket_of(n, 9) for n in names(64)) == {0: 34, 1: 19, 2: 11}


def test_every_bracket_is_listed_and_each_cycle_holds_its_shares_exactly():
    hb = Hyperband(eta=2)
    assert hb.brackets_of([], 8) == {0: [], 1: [], 2: [], 3: []}
    for start in (0, 5, 1000):
        cycle = [hb.bracket_of(f"run-{start + i}", 8) for i in range(22)]
        assert Counter(cycle) == {0: 8, 1: 6, 2: 4, 3: 4}
    # Many brackets: a long cycle (2**11 places and more), found without listing it.
    wide = Hyperband(eta=2, brackets=12)
    assert Counter(wide.bracket_of(f"run-{i}", 8) for i in range(20000))[0] > 4000


def test_the_number_of_brackets_follows_the_runs_chunk_count():
    assert [Hyperband(eta=2).bracket_count(r) for r in (1, 2, 3, 4, 7, 8, 16)] \
        == [1, 2, 2, 3, 3, 4, 5]
    assert [Hyperband(eta=3).bracket_count(r) for r in (2, 3, 8, 9, 10, 27)] \
        == [1, 2, 2, 3, 3, 4]
    assert Hyperband(eta=2, min_chunks=2).bracket_count(8) == 3  # floor(log2(8 / 2)) + 1
    assert Hyperband(eta=2, min_chunks=4).bracket_count(2) == 1  # no rung at all
    assert Hyperband(eta=2, brackets=2).bracket_count(16) == 2


def test_each_brackets_rungs_and_evaluates_at_them_only():
    hb = Hyperband(eta=2)
    # The last bracket's first rung would be chunk 8, the runs' last: it never stops a run.
    assert [hb.rungs(b, 8) for b in range(4)] == [[1, 2, 4], [2, 4], [4], []]
    assert [Hyperband(eta=3).rungs(b, 10) for b in range(3)] == [[1, 3, 9], [3, 9], [9]]
    assert [Hyperband(eta=3, min_chunks=2).rungs(b, 20) for b in range(2)] == [[2, 6, 18], [6, 18]]
    for name in names(22):
        b = hb.bracket_of(name, 8)
        assert [c for c in range(1, 9) if hb.evaluates_at(name, c, 8)] == hb.rungs(b, 8)


def test_names_that_are_not_run_numbers_get_a_stable_hash():
    hb = Hyperband(eta=2)
    # crc32 of the name picks the place in the 22-place cycle.
    assert hb.bracket_of("baseline", 8) == CYCLE_2_8[zlib.crc32(b"baseline") % 22]
    assert hb.bracket_of("run-7", 8) == CYCLE_2_8[7]


def test_deterministic_across_instances_and_processes():
    probe = ["run-0", "run-13", "run-40", "baseline", "lr-small", "run-x"]
    a, b = Hyperband(eta=2), Hyperband(eta=2)
    assert [a.bracket_of(n, 8) for n in probe] == [b.bracket_of(n, 8) for n in probe]
    code = ("from trl_rapidfire.control.policies.hyperband import Hyperband; h = Hyperband(); "
            f"print([h.bracket_of(n, 8) for n in {probe!r}])")
    seen = set()
    for seed in ("1", "2"):  # Python's str hash() differs between these processes
        env = dict(os.environ, PYTHONHASHSEED=seed)
        seen.add(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                capture_output=True, text=True).stdout.strip())
    assert seen == {str([a.bracket_of(n, 8) for n in probe])}


@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"eta": 1}, "eta"), ({"eta": 2.5}, "eta"), ({"eta": True}, "eta"),
    ({"min_chunks": 0}, "min_chunks"), ({"min_chunks": 1.0}, "min_chunks"),
    ({"brackets": 0}, "brackets"), ({"brackets": 33}, "brackets"),
    ({"brackets": "all"}, "brackets"), ({"metric": ""}, "metric"), ({"mode": "best"}, "mode"),
])
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=f"^{argument} must"):
        Hyperband(**kwargs)


# --- decisions -------------------------------------------------------------------------------

def one_worker(policy, values, total=8):
    """Train every run chunk by chunk, least progress first (one worker), each run's eval loss
    a constant; returns (chunk, run, reason) of every stop and the runs still going."""
    runs = {n: run(n, [], total) for n in values}
    stops = []
    for chunk in range(1, total + 1):
        for name in values:
            if runs[name].status != RunStatus.RUNNING:
                continue
            runs[name] = run(name, [values[name]] * chunk, total)
            for d in policy.on_chunk_end(name, Context(dict(runs))):
                assert d.action == "stop"
                stops.append((chunk, d.run, d.reason))
                runs[d.run] = replace(runs[d.run], status=RunStatus.STOPPED)
    return stops, {n for n, h in runs.items() if h.status == RunStatus.RUNNING}


def test_twelve_runs_stopped_at_their_brackets_rungs_as_computed_by_hand():
    # Brackets of run-0..11 (CYCLE_2_8): 0: runs 0 4 6 10 11; 1: runs 1 5 9; 2: runs 2 7;
    # 3: runs 3 8. Every run outside bracket 0 is worse than every run in it: compared
    # across brackets they would all go.
    values = {"run-0": 1.0, "run-4": 2.0, "run-6": 3.0, "run-10": 4.0, "run-11": 0.5,
              "run-1": 5.0, "run-5": 6.0, "run-9": 7.0, "run-2": 9.0, "run-7": 8.0,
              "run-3": 10.0, "run-8": 11.0}
    order = {n: values[n] for n in names(12)}
    stops, going = one_worker(Hyperband(eta=2), order)
    assert stops == [
        # Bracket 0, rung 0 (chunk 1): keep 5 // 2 = 2 of 5; run-4 waits and is judged
        # again when run-11 arrives.
        (1, "run-6", "bracket 0, rung 0: eval_loss 3 not in best 1/2 of 5 (2 better)"),
        (1, "run-10", "bracket 0, rung 0: eval_loss 4 not in best 1/2 of 5 (3 better)"),
        (1, "run-4", "bracket 0, rung 0: eval_loss 2 not in best 1/2 of 5 (2 better)"),
        # Chunk 2: bracket 1's rung 0 (keep 1 of 3) and bracket 0's rung 1 (1 of 2).
        (2, "run-5", "bracket 1, rung 0: eval_loss 6 not in best 1/2 of 3 (1 better)"),
        (2, "run-9", "bracket 1, rung 0: eval_loss 7 not in best 1/2 of 3 (2 better)"),
        (2, "run-0", "bracket 0, rung 1: eval_loss 1 not in best 1/2 of 2 (1 better)"),
        # Chunk 4: bracket 2's only rung; brackets 0 and 1 have one run left each.
        (4, "run-2", "bracket 2, rung 0: eval_loss 9 not in best 1/2 of 2 (1 better)"),
    ]
    # Bracket 3 has no rung before chunk 8: its two runs, the worst of all, run to the end.
    assert going == {"run-11", "run-1", "run-7", "run-3", "run-8"}


def test_a_run_is_never_compared_with_another_brackets_runs():
    hb = Hyperband(eta=2)
    b1 = [run("run-1", [5.0, 5.0]), run("run-5", [6.0, 6.0])]
    [d] = hb.on_chunk_end("run-5", ctx(*b1))
    assert (d.run, d.reason) == ("run-5", "bracket 1, rung 0: eval_loss 6 not in best 1/2 of 2 "
                                          "(1 better)")
    # Far better runs of bracket 0 at the same rung, and a worse one waiting there: nothing
    # changes for bracket 1, and bracket 0's waiting run is not judged by bracket 1's arrival.
    b0 = [run("run-0", [0.1, 0.1]), run("run-4", [0.2, 0.2]), run("run-6", [9.0, 9.0])]
    assert hb.on_chunk_end("run-5", ctx(*b1, *b0)) == [d]
    assert hb.on_chunk_end("run-1", ctx(*b1, *b0)) == [d]
    # Bracket 1 has no rung at chunk 1: a run there is not judged, however bad.
    assert hb.on_chunk_end("run-1", ctx(run("run-1", [99.0]), *[run(n, [0.1]) for n in
                                        ("run-0", "run-4", "run-5")])) == []


def test_runs_of_the_bracket_still_to_come_count():
    hb = Hyperband(eta=2)
    # Bracket 1 (runs 1, 5, 9, 12, ...) at chunk 2: runs 9 and 12 have not arrived, so the
    # rung is 4 runs (keep 2); run-5 has one better: it stays.
    arrived = [run("run-1", [5.0, 5.0]), run("run-5", [6.0, 6.0])]
    assert hb.on_chunk_end("run-5", ctx(*arrived, run("run-9", [7.0]), run("run-12", []))) == []
    # Bracket-0 runs behind it (runs 0 and 4, one chunk) are not among bracket 1's to come:
    # the rung is 2 runs (keep 1).
    others = [run("run-0", [1.0]), run("run-4", [])]
    [d] = hb.on_chunk_end("run-5", ctx(*arrived, *others))
    assert d.reason == "bracket 1, rung 0: eval_loss 6 not in best 1/2 of 2 (1 better)"


def test_nan_fails_the_run_at_its_brackets_rung_only():
    hb = Hyperband(eta=2)
    peer = run("run-1", [5.0, 5.0])
    [d] = hb.on_chunk_end("run-5", ctx(peer, run("run-5", [1.0, math.nan])))
    assert d == Decision("run-5", "fail", "bracket 1: eval_loss is NaN at rung 0 (2 chunks)")
    # At chunk 1 (no rung of bracket 1) a NaN is not read; a NaN peer does not count.
    assert hb.on_chunk_end("run-5", ctx(peer, run("run-5", [math.nan]))) == []
    assert hb.on_chunk_end("run-1", ctx(peer, run("run-5", [1.0, math.nan]))) == []


def test_deleted_runs_do_not_count():
    hb = Hyperband(eta=2)
    gone = run("run-9", [0.1, 0.1], status=RunStatus.DELETED)
    [d] = hb.on_chunk_end("run-5", ctx(run("run-1", [5.0, 5.0]), run("run-5", [6.0, 6.0]), gone))
    assert d.reason == "bracket 1, rung 0: eval_loss 6 not in best 1/2 of 2 (1 better)"
    # With only the deleted run better, the rung is one run: it stays.
    assert hb.on_chunk_end("run-5", ctx(run("run-5", [6.0, 6.0]), gone)) == []


def test_a_clone_made_mid_flight_gets_its_bracket_by_the_same_rule():
    hb = Hyperband(eta=2)
    assert hb.bracket_of("run-12", 8) == CYCLE_2_8[12] == 1
    old = [run("run-1", [5.0, 4.0, 3.0]), run("run-5", [6.0, 5.5, 5.0, 4.5],
                                              status=RunStatus.STOPPED)]
    clone = run("run-12", [9.0, 8.0], parent="run-1")
    [d] = hb.on_chunk_end("run-12", ctx(*old, clone, run("run-0", [0.1, 0.1])))
    assert d.reason == "bracket 1, rung 0: eval_loss 8 not in best 1/2 of 3 (2 better)"


def test_one_bracket_is_successive_halving():
    rng = random.Random(3)
    hb, sh = Hyperband(eta=2, brackets=1), SuccessiveHalving(eta=2)
    for trial in range(10):
        values = {n: rng.choice([rng.random(), 0.5]) for n in names(10)}
        hb_stops, hb_left = one_worker(hb, values)
        sh_stops, sh_left = one_worker(sh, values)
        assert hb_left == sh_left, trial
        assert hb_stops == [(c, r, f"bracket 0, {why}") for c, r, why in sh_stops], trial


# --- in training -----------------------------------------------------------------------------

def test_hyperband_in_training_stops_by_bracket_as_the_logged_losses_predict(tmp_path):
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    hb = Hyperband("eval_loss", "min", eta=2)
    # 4 chunks: 3 brackets, shares 4, 3, 3, places 0 1 2 0 1 2: bracket 0 = runs 0 and 3
    # (rungs 1, 2), bracket 1 = runs 1 and 4 (rung 2), bracket 2 = runs 2 and 5 (none).
    lrs = [1e-5, 3e-3, 1e-4, 1e-2, 1e-3, 3e-2]
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List(lrs),
                         num_chunks=4, num_train_epochs=1, per_device_train_batch_size=4,
                         per_device_eval_batch_size=8, eval_strategy="policy",
                         **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(32, seed=1),  # 8 steps: 2 a chunk
        eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4),
        policy=hb,
    )
    rf.train()
    assert hb.brackets_of(names(6), 4) == {0: ["run-0", "run-3"], 1: ["run-1", "run-4"],
                                           2: ["run-2", "run-5"]}
    histories = {}
    for name, slot in rf.engine.slots.items():
        histories[name] = RunHistory(name, slot.state.status, slot.state.chunks_done,
                                     len(slot.plan), tuple(c.end_step for c in slot.plan.chunks),
                                     tuple(slot.live_trainer().state.log_history))
    # Evaluated at its bracket's rungs and its last chunk only.
    for name, h in histories.items():
        ends = {end: i + 1 for i, end in enumerate(h.chunk_ends)}
        evals = [ends[e["step"]] for e in h.log if "eval_loss" in e]
        rungs = [c for c in hb.rungs(hb.bracket_of(name, 4), 4) if c <= h.chunks_done]
        assert evals == rungs + ([4] if h.chunks_done == 4 else []), name
    # Synchronous halving per bracket from the logged losses (one worker: what ASHA gives).
    predicted = {}
    for bracket, members in hb.brackets_of(names(6), 4).items():
        alive = list(members)
        for rung, chunks in enumerate(hb.rungs(bracket, 4)):
            loss = {n: metric_at(histories[n], "eval_loss", chunks) for n in alive}
            keep = max(1, len(alive) // 2)
            for n in alive:
                if sum(v < loss[n] for v in loss.values()) >= keep:
                    predicted[n] = f"bracket {bracket}, rung {rung}: eval_loss {loss[n]:.4g}"
            alive = [n for n in alive if n not in predicted]
    stops = {o.run: o.result for o in rf.op_log if o.source == "policy:Hyperband"}
    assert set(stops) == set(predicted) and len(stops) >= 2
    for name, result in stops.items():
        assert result.startswith("ok: stopped at step ")
        assert f" by Hyperband {predicted[name]} not in best 1/2 of 2 (1 better)" in result
    status = {r.name: r.status for r in rf.runs}
    assert {n for n, s in status.items() if s == RunStatus.STOPPED} == set(predicted)
    assert status["run-2"] == status["run-5"] == RunStatus.COMPLETED  # the hedge bracket
