"""A worker's claim queue answers what the full pass over every run answers, kept up to date by
the shared state's change feed alone (other workers' journal lines, its own transactions,
compactions by anyone), and a claim's transaction does work that does not grow with the runs."""

from __future__ import annotations

import random

import pytest

from trl_rapidfire.shared_state import state_file
from trl_rapidfire.shared_state.run_queue import RunQueue
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.shared_state.scheduler import Order, rank
from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.shared_state.store import (
    choose,
    claim_next,
    expire,
    fail_claimed,
    finish_chunk,
    mark_durable,
    release,
)

LEASE = 30.0
WORKERS = ("w0", "w1")


def _mutate(rng: random.Random, st, worker: str, queue: RunQueue, step: int, gone: set) -> str:
    """One random change of the kind workers make, by ``worker``; returns what it did."""
    mine = [n for n, c in st.claims.items() if c.worker == worker]
    kind = rng.choice(["claim", "claim", "claim", "finish", "finish", "release", "stop",
                       "resume", "durable", "add", "fail", "gone"])
    if kind == "claim":
        claim_next(st, worker, now=step, lease_seconds=LEASE, alive=lambda w: w not in gone,
                   pick=queue.pick)
    elif kind == "finish" and mine:
        name = rng.choice(mine)
        finish_chunk(st, name, worker, st.claims[name].chunk, global_step=step,
                     durable=rng.random() < 0.3, complete=rng.random() < 0.05)
    elif kind == "release" and mine:
        release(st, rng.choice(mine), worker)
    elif kind == "stop":
        record = st.runs[rng.choice(st.order)]
        if record.status.schedulable:
            record.move(RunStatus.STOPPED)
    elif kind == "resume":
        record = st.runs[rng.choice(st.order)]
        if record.status == RunStatus.STOPPED:
            record.move(RunStatus.RUNNING)
    elif kind == "durable":
        name = rng.choice(st.order)
        record = st.runs[name]
        mark_durable(st, name, worker, record.chunks_done, record.global_step)
    elif kind == "add":
        st.add_run(f"run-{len(st.order)}", rng.randint(1, 6))
    elif kind == "fail" and mine:
        name = rng.choice(mine)
        if st.runs[name].status.schedulable:
            fail_claimed(st, name, worker, "boom")
    elif kind == "gone":
        # The other worker is gone: its claims drop, its volatile chunks roll back.
        other = next(w for w in WORKERS if w != worker)
        gone.add(other)
        expire(st, now=step, alive=lambda w: w not in gone)
        gone.discard(other)
    return kind


@pytest.mark.parametrize("order", list(Order))
@pytest.mark.parametrize("seed", range(12))
def test_the_queue_picks_what_the_full_pass_picks(tmp_path, monkeypatch, seed, order):
    # Small snapshots: compactions (by either worker) happen every few dozen transactions and
    # make the other worker read the state whole.
    monkeypatch.setattr(state_file, "_MIN_COMPACT_BYTES", 3000)
    rng = random.Random(seed)
    folder = tmp_path / ".rapidfire"
    stores = {w: FileStore(folder, "fp") for w in WORKERS}
    with stores["w0"].transaction() as st:
        for i in range(rng.randint(3, 25)):
            st.add_run(f"run-{i}", rng.randint(1, 6))
    queues = {w: RunQueue(w, order) for w in WORKERS}
    kinds, claimed, compared = set(), 0, 0
    gone: set[str] = set()
    for step in range(150):
        worker = rng.choice(WORKERS)
        with stores[worker].transaction(durable=False) as st:
            queues[worker].update(st, stores[worker].take_changed_runs())
            mine = {n for n, c in st.claims.items() if c.worker == worker}
            for finishing in (frozenset(), frozenset(rng.sample(sorted(mine), len(mine)))):
                assert queues[worker].pick(st, worker, finishing) \
                    == choose(st, worker, finishing, order)
                compared += 1
            before = len(st.claims)
            kinds.add(_mutate(rng, st, worker, queues[worker], step, gone))
            claimed += len(st.claims) > before
            # Within the same body, after the change: the queue taken up to date again.
            queues[worker].update(st, stores[worker].take_changed_runs())
            assert queues[worker].pick(st, worker) == choose(st, worker, order=order)
    assert claimed > 10 and compared == 300
    assert {"claim", "finish", "stop", "add", "gone"} <= kinds


def test_the_feed_reports_other_workers_changes_and_the_bodys_own(tmp_path):
    folder = tmp_path / ".rapidfire"
    a, b = FileStore(folder, "fp"), FileStore(folder, "fp")
    with a.transaction() as st:
        for i in range(50):
            st.add_run(f"run-{i}", 4)
    with a.transaction() as st:
        a.take_changed_runs()  # whatever was there before
        assert a.take_changed_runs() == set()  # taken: nothing new
    with b.transaction() as st:
        assert b.take_changed_runs() is None  # its first read: the state whole
        claim_next(st, "w1", now=0, lease_seconds=LEASE)  # run-0
        assert b.take_changed_runs() == {"run-0"}  # the body's own change, as it happens
    with b.transaction() as st:
        assert b.take_changed_runs() == {"run-0"}  # its journal line, once more
        assert b.take_changed_runs() == set()
    with a.transaction() as st:
        assert a.take_changed_runs() == {"run-0"}  # the other worker's line, replayed
        st.runs["run-7"].move(RunStatus.STOPPED)
        st.owner["run-9"] = "w0"
        assert a.take_changed_runs() == {"run-7", "run-9"}
    with pytest.raises(RuntimeError, match="inside a transaction"):
        a.take_changed_runs()


def test_a_claim_recomputes_only_the_runs_that_changed(tmp_path, monkeypatch):
    """Fed by the change feed, the queue recomputes a handful of runs per claim at 400 runs
    (the claimed and finished ones), not 400: a feed that said "possibly all" every time, or a
    queue that rebuilt itself, would make every claim a pass over the runs again."""
    folder = tmp_path / ".rapidfire"
    store = FileStore(folder, "fp")
    with store.transaction() as st:
        for i in range(400):
            st.add_run(f"run-{i}", 4)
    queue = RunQueue("w0")
    computed = []
    original = RunQueue._key_of

    def counting(self, state, name, **kw):
        computed.append(name)
        return original(self, state, name, **kw)

    monkeypatch.setattr(RunQueue, "_key_of", counting)
    for step in range(40):
        with store.transaction(durable=False) as st:
            queue.update(st, store.take_changed_runs())
            if step == 0:
                assert len(computed) == 400  # built once from the whole state
                computed.clear()
            name = queue.pick(st, "w0")
            assert name == choose(st, "w0")
            claim_next(st, "w0", now=step, lease_seconds=LEASE, pick=queue.pick)
            finish_chunk(st, name, "w0", st.claims[name].chunk, global_step=step, durable=False)
    assert 0 < len(computed) <= 3 * 39  # the finished run (and its neighbours), per claim


@pytest.mark.parametrize("order", list(Order))
def test_the_rank_as_a_float_orders_and_ties_as_exact_fractions(order):
    from fractions import Fraction

    def exact(done, total):  # the order's rule, in fractions
        progress = Fraction(done, total)
        return progress if order is Order.EVEN else (-1 if done == 0 else 1 - progress)

    pairs = [(d, t) for t in range(1, 301) for d in range(t + 1)]
    by_exact: dict = {}
    for d, t in pairs:
        by_exact.setdefault(exact(d, t), set()).add(rank(d, t, order))
    assert all(len(floats) == 1 for floats in by_exact.values())  # equal ratios tie
    ranks = [next(iter(by_exact[e])) for e in sorted(by_exact)]
    assert all(a < b for a, b in zip(ranks, ranks[1:]))  # and keep the exact order
    assert rank(1, 3, order) == rank(2, 6, order) == rank(100, 300, order)
