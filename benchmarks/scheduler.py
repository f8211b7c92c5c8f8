"""Scheduler benchmark: how long one scheduling decision takes, and how many claims per second
the file-locked store sustains with several contending worker processes.

(1) ``claim_next`` on an in-memory state of ``--runs`` runs (default 1,000): the pure decision
    (expire leases, rank runs by progress, claim), median over many decisions. Target < 1 ms.
(2) ``--workers`` processes (default 4) each loop ``claim`` + ``finish`` transactions on one
    ``FileStore`` (JSON under a file lock, atomic fsync'd writes) for ``--seconds``: total
    claims per second, and the same with a single process for comparison.

(3) One claim + finish transaction at 10 runs and at ``--runs`` runs: the cost of a turn's
    claim as the experiment grows. Target: within 2x.

Run: ``python benchmarks/scheduler.py``. Times are for this machine and its disk; the ratios
(contended vs single) matter more than the absolute numbers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

from trl_rapidfire.store import ExperimentState, FileStore, claim_next, finish_chunk

LEASE = 60.0


def decision_time(runs: int, decisions: int = 500) -> float:
    """Median seconds of one claim_next + finish_chunk on an in-memory state of ``runs``."""
    state = ExperimentState("bench")
    for i in range(runs):
        state.add_run(f"run-{i}", 1_000_000)
    times = []
    for k in range(decisions):
        t0 = time.perf_counter()
        claimed = claim_next(state, f"w{k % 4}", now=float(k), lease_seconds=LEASE)
        times.append(time.perf_counter() - t0)
        finish_chunk(state, claimed[0], f"w{k % 4}", claimed[1])
    return statistics.median(times)


def _worker(folder: str, name: str, seconds: float, out: multiprocessing.Queue) -> None:
    store = FileStore(folder, "bench")
    deadline = time.monotonic() + seconds
    claims = 0
    while time.monotonic() < deadline:
        with store.transaction() as state:
            claimed = claim_next(state, name, now=time.time(), lease_seconds=LEASE)
        if claimed is None:
            continue
        with store.transaction() as state:
            finish_chunk(state, claimed[0], name, claimed[1])
        claims += 1
    out.put(claims)


def claims_per_second(workers: int, runs: int, seconds: float) -> float:
    with tempfile.TemporaryDirectory(prefix="rf-scheduler-bench-") as tmp:
        folder = str(Path(tmp) / ".rapidfire")
        store = FileStore(folder, "bench")
        with store.transaction() as state:
            for i in range(runs):
                state.add_run(f"run-{i}", 1_000_000)
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(folder, f"w{k}", seconds, out))
                 for k in range(workers)]
        for p in procs:
            p.start()
        total = sum(out.get(timeout=seconds + 60) for _ in procs)
        for p in procs:
            p.join()
        return total / seconds


def transaction_time(runs: int, transactions: int = 100) -> float:
    """Median seconds of one claim + finish in one non-durable transaction of a ``FileStore``
    holding ``runs`` runs (one process): what a turn's claim costs as the experiment grows."""
    with tempfile.TemporaryDirectory(prefix="rf-scheduler-bench-") as tmp:
        store = FileStore(str(Path(tmp) / ".rapidfire"), "bench")
        with store.transaction() as state:
            for i in range(runs):
                state.add_run(f"run-{i}", 1_000_000, {"learning_rate": 1e-3 * (i + 1),
                                                      "lr_scheduler_type": "cosine"})
        times = []
        for _ in range(transactions):
            t0 = time.perf_counter()
            with store.transaction(durable=False) as state:
                claimed = claim_next(state, "w0", now=time.time(), lease_seconds=LEASE)
                finish_chunk(state, claimed[0], "w0", claimed[1])
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)

    median = decision_time(args.runs)
    print(f"(1) one scheduling decision at {args.runs} runs: {median * 1e3:.3f} ms "
          f"(median of 500)   target < 1 ms   [{'met' if median < 1e-3 else 'MISSED'}]")
    store_runs = min(args.runs, 64)
    single = claims_per_second(1, store_runs, args.seconds)
    many = claims_per_second(args.workers, store_runs, args.seconds)
    print(f"(2) file-locked store, {store_runs} runs: {single:.0f} claims/s with 1 process, "
          f"{many:.0f} claims/s with {args.workers} contending processes "
          f"(ratio {many / single:.2f}); each claim is two transactions (claim, finish)")
    small, large = transaction_time(10), transaction_time(args.runs)
    ratio = large / small
    print(f"(3) one transaction (claim + finish, not fsync'd): {small * 1e3:.2f} ms at 10 runs, "
          f"{large * 1e3:.2f} ms at {args.runs} runs (ratio {ratio:.1f})   target <= 2   "
          f"[{'met' if ratio <= 2 else 'MISSED'}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
