"""The shared scheduler state: transactions, claims and leases, and many processes at once."""

from __future__ import annotations

import json
import multiprocessing
import random
import time

import pytest

from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.shared_state.store import StoreError, claim_next, finish_chunk, renew

LEASE = 30.0


def _store(tmp_path, runs=3, chunks=2, fingerprint="fp"):
    store = FileStore(tmp_path / ".rapidfire", fingerprint)
    with store.transaction() as state:
        for i in range(runs):
            state.add_run(f"run-{i}", chunks)
    return store


def test_claims_follow_the_scheduler_and_each_chunk_is_claimed_once(tmp_path):
    store = _store(tmp_path)
    with store.transaction() as state:
        a = claim_next(state, "w0", now=0, lease_seconds=LEASE)
        b = claim_next(state, "w1", now=0, lease_seconds=LEASE)
    assert (a, b) == (("run-0", 0), ("run-1", 0))
    with store.transaction() as state:
        assert finish_chunk(state, "run-0", "w0", 0)
        # w0's affinity: run-0 is resident there, but run-2 has less progress.
        assert claim_next(state, "w0", now=1, lease_seconds=LEASE) == ("run-2", 0)
        assert claim_next(state, "w2", now=1, lease_seconds=LEASE) == ("run-0", 1)
    state = store.read()
    assert state.runs["run-0"].chunks_done == 1 and state.runs["run-0"].status == "running"
    assert set(state.claims) == {"run-1", "run-2", "run-0"}


def test_an_expired_lease_is_taken_over_and_the_late_finish_is_refused(tmp_path):
    store = _store(tmp_path, runs=1)
    with store.transaction() as state:
        assert claim_next(state, "dead", now=0, lease_seconds=10) == ("run-0", 0)
        assert claim_next(state, "w1", now=5, lease_seconds=10) is None  # lease still live
        assert not renew(state, "run-0", "w1", now=5, lease_seconds=10)
        assert claim_next(state, "w1", now=11, lease_seconds=10) == ("run-0", 0)
        assert not finish_chunk(state, "run-0", "dead", 0)  # its work is discarded
        assert finish_chunk(state, "run-0", "w1", 0)
    assert store.read().runs["run-0"].chunks_done == 1


def test_stopped_runs_are_not_claimed_and_completion_is_recorded(tmp_path):
    store = _store(tmp_path, runs=2, chunks=1)
    with store.transaction() as state:
        state.runs["run-0"].move(RunStatus.STOPPED)
        assert claim_next(state, "w", now=0, lease_seconds=LEASE) == ("run-1", 0)
        assert claim_next(state, "w", now=0, lease_seconds=LEASE) is None
        assert finish_chunk(state, "run-1", "w", 0)
    assert store.read().runs["run-1"].status == RunStatus.COMPLETED


def test_a_failing_transaction_writes_nothing(tmp_path):
    store = _store(tmp_path, runs=1)
    before = (tmp_path / ".rapidfire" / "scheduler.json").read_text()
    with pytest.raises(RuntimeError), store.transaction() as state:
        claim_next(state, "w", now=0, lease_seconds=LEASE)
        raise RuntimeError("worker crashed mid-transaction")
    assert (tmp_path / ".rapidfire" / "scheduler.json").read_text() == before


def test_another_experiments_state_is_refused(tmp_path):
    _store(tmp_path, fingerprint="a")
    with pytest.raises(StoreError, match="other runs"):
        FileStore(tmp_path / ".rapidfire", "b")
    (tmp_path / ".rapidfire" / "scheduler.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(StoreError, match="not a trl-rapidfire scheduler state"):
        FileStore(tmp_path / ".rapidfire", "a").read()


def _worker(folder, worker, seed, log_path):
    rng = random.Random(seed)
    store = FileStore(folder, "stress")
    done = []
    idle = 0
    while idle < 200:
        with store.transaction() as state:
            if rng.random() < 0.05:  # a person stops or resumes something now and then
                run = state.runs[rng.choice(state.order)]
                if run.status.schedulable and rng.random() < 0.5:
                    run.move(RunStatus.STOPPED)
                elif run.status == RunStatus.STOPPED:
                    run.resume()
            claimed = claim_next(state, worker, now=time.time(), lease_seconds=LEASE)
            if claimed is None:
                stopped = [n for n, r in state.runs.items() if r.status == RunStatus.STOPPED]
                for name in stopped:  # keep the experiment finishing: resume what was stopped
                    state.runs[name].resume()
        if claimed is None:
            idle += 1
            time.sleep(0.002)
            continue
        idle = 0
        time.sleep(rng.random() * 0.002)  # "training"
        with store.transaction() as state:
            if finish_chunk(state, claimed[0], worker, claimed[1]):
                done.append(claimed)
    with open(log_path, "w") as fh:
        json.dump(done, fh)


def test_stress_four_processes_64_runs_no_chunk_lost_or_trained_twice(tmp_path):
    folder = tmp_path / ".rapidfire"
    store = FileStore(folder, "stress")
    with store.transaction() as state:
        for i in range(64):
            state.add_run(f"run-{i}", 3 + i % 3)
    ctx = multiprocessing.get_context("fork")
    logs = [tmp_path / f"w{k}.json" for k in range(4)]
    procs = [ctx.Process(target=_worker, args=(folder, f"w{k}", k, logs[k])) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    trained = [tuple(x) for log in logs for x in json.loads(log.read_text())]
    expected = {(f"run-{i}", c) for i in range(64) for c in range(3 + i % 3)}
    assert len(trained) == len(set(trained)) == len(expected)  # none twice
    assert set(trained) == expected  # none lost
    per_worker = [len(json.loads(log.read_text())) for log in logs]
    assert all(n > 0 for n in per_worker), per_worker  # every worker got work
    final = store.read()
    assert all(r.status == RunStatus.COMPLETED for r in final.runs.values())
    assert not final.claims


def test_a_run_stopped_during_its_last_chunk_completes_when_the_chunk_ends(tmp_path):
    store = _store(tmp_path, runs=1, chunks=1)
    with store.transaction() as state:
        claim_next(state, "w", now=0, lease_seconds=LEASE)
        state.runs["run-0"].move(RunStatus.STOPPED)
        assert finish_chunk(state, "run-0", "w", 0)
    assert store.read().runs["run-0"].status == RunStatus.COMPLETED


# ---- gangs (runs trained by several workers together, e.g. FSDP) ------------------------------


def _alive(*dead):
    return lambda worker: worker not in dead


def test_a_gang_forms_from_the_next_workers_to_ask_and_records_its_chunk_once(tmp_path):
    from trl_rapidfire.shared_state.gang_state import finish_gang_chunk, gang_ready

    store = _store(tmp_path, runs=3)
    with store.transaction() as state:
        state.gang_size["run-1"] = 2
        assert claim_next(state, "w0", now=0, lease_seconds=LEASE, alive=_alive()) \
            == ("run-0", 0)
        # w1 is given the gang run (next by the rule) and waits: the gang needs 2 workers.
        assert claim_next(state, "w1", now=0, lease_seconds=LEASE, alive=_alive()) \
            == ("run-1", 0)
        assert gang_ready(state) is False
        assert finish_chunk(state, "run-0", "w0", 0)
        # w0 is done with run-0; run-2 has less progress, but a forming gang comes first.
        assert claim_next(state, "w0", now=1, lease_seconds=LEASE, alive=_alive()) \
            == ("run-1", 0)
        assert gang_ready(state) is True
        assert finish_gang_chunk(state, "run-1", "w1", 0, global_step=4) is None  # not last
        assert state.runs["run-1"].chunks_done == 0
        assert finish_gang_chunk(state, "run-1", "w0", 0, global_step=4) is True
        assert state.gang is None and "run-1" not in state.claims
        assert state.runs["run-1"].chunks_done == 1 and state.runs["run-1"].global_step == 4
        # Single runs again.
        assert claim_next(state, "w0", now=2, lease_seconds=LEASE, alive=_alive()) \
            == ("run-2", 0)
    assert store.read().gang is None


def test_a_gang_breaks_up_when_a_member_dies_and_its_chunk_is_trained_again(tmp_path):
    from trl_rapidfire.shared_state.gang_state import finish_gang_chunk, gang_ready

    store = _store(tmp_path, runs=1)
    with store.transaction() as state:
        state.gang_size["run-0"] = 2
        claim_next(state, "w0", now=0, lease_seconds=LEASE, alive=_alive())
        claim_next(state, "w1", now=0, lease_seconds=LEASE, alive=_alive())
        assert gang_ready(state) is True
        # w1 dies mid-chunk: the next claim by w0 finds the gang gone and forms a new one.
        assert claim_next(state, "w0", now=1, lease_seconds=LEASE, alive=_alive("w1")) \
            == ("run-0", 0)
        assert state.gang["members"] == ["w0"] and gang_ready(state) is False
        assert finish_gang_chunk(state, "run-0", "w1", 0) is False  # the dead one's work
        assert state.runs["run-0"].chunks_done == 0


def test_a_stop_disbands_a_forming_gang_but_not_one_that_trains(tmp_path):
    from trl_rapidfire.shared_state.gang_state import disband_forming_gang

    store = _store(tmp_path, runs=2)
    with store.transaction() as state:
        state.gang_size["run-0"] = 2
        claim_next(state, "w1", now=0, lease_seconds=LEASE, alive=_alive())  # opens the gang
        state.runs["run-0"].move(RunStatus.STOPPED)  # the op, applied by w0 meanwhile
        assert disband_forming_gang(state, "run-0") is True
        assert state.gang is None and "run-0" not in state.claims
        # w0 asks next: the stopped run is not given out again.
        assert claim_next(state, "w0", now=1, lease_seconds=LEASE, alive=_alive()) \
            == ("run-1", 0)
        # A gang with all its members is training: it finishes its chunk.
        state.runs["run-0"].resume()
        finish_chunk(state, "run-1", "w0", 0)
        claim_next(state, "w0", now=2, lease_seconds=LEASE, alive=_alive())
        claim_next(state, "w1", now=2, lease_seconds=LEASE, alive=_alive())
        assert state.gang["run"] == "run-0" and len(state.gang["members"]) == 2
        assert disband_forming_gang(state, "run-0") is False and state.gang is not None


def test_a_member_leaving_ends_the_gang_and_the_state_round_trips(tmp_path):
    from trl_rapidfire.shared_state.store import release

    store = _store(tmp_path, runs=1)
    with store.transaction() as state:
        state.gang_size["run-0"] = 2
        claim_next(state, "w0", now=0, lease_seconds=LEASE, alive=_alive())
    doc = FileStore(tmp_path / ".rapidfire", "fp").peek().to_json()
    assert doc["gang"] == {"run": "run-0", "chunk": 0, "members": ["w0"], "done": []}
    assert doc["gang_size"] == {"run-0": 2}
    with store.transaction() as state:
        assert release(state, "run-0", "w0")
        assert state.gang is None and not state.claims
