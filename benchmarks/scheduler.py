"""Scheduler benchmark: how long one scheduling decision takes, and how many claims per second
the file-locked store sustains with several contending worker processes.

(1) ``claim_next`` on an in-memory state of ``--runs`` runs (default 1,000): the pure decision
    (expire leases, rank runs by progress, claim), median over many decisions. Target < 1 ms.
(2) ``--workers`` processes (default 4) each loop ``claim`` + ``finish`` transactions on one
    ``FileStore`` (under a file lock, each change an fsync'd journal line) for ``--seconds``: total
    claims per second, and the same with a single process for comparison.

(3) The store's cost of one transaction at 10 runs and at ``--runs`` runs, for the same small
    change (a lease renewal and a chunk's record: what a turn writes): the state is journalled
    (``state_file.py``), so this stays flat as the experiment grows. Target: within 2x. Beside
    it, the whole claim + finish transaction, which also makes the scheduling decision of (1)
    (linear in the runs, well under a millisecond at 1,000).

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

from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.shared_state.store import Claim, ExperimentState, claim_next, finish_chunk, renew

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


def transaction_time(runs: int, transactions: int = 300, decide: bool = False
                     ) -> tuple[float, float]:
    """Median and mean seconds of one non-durable transaction of a ``FileStore`` holding
    ``runs`` runs (one process): a lease renewal plus one chunk's record, or, with ``decide``,
    a claim by the scheduler's rule plus its record. The mean includes the compactions."""
    with tempfile.TemporaryDirectory(prefix="rf-scheduler-bench-") as tmp:
        store = FileStore(str(Path(tmp) / ".rapidfire"), "bench")
        with store.transaction() as state:
            for i in range(runs):
                state.add_run(f"run-{i}", 1_000_000, {"learning_rate": 1e-3 * (i + 1),
                                                      "lr_scheduler_type": "cosine"})
        times = []
        for k in range(transactions):
            name = f"run-{k % runs}"
            if not decide:
                with store.transaction(durable=False) as state:
                    state.claims[name] = Claim("w0", state.runs[name].chunks_done, 0.0)
            t0 = time.perf_counter()
            with store.transaction(durable=False) as state:
                if decide:
                    name, chunk = claim_next(state, "w0", now=time.time(), lease_seconds=LEASE)
                else:
                    chunk = state.claims[name].chunk
                    renew(state, name, "w0", now=time.time(), lease_seconds=LEASE)
                finish_chunk(state, name, "w0", chunk)
            times.append(time.perf_counter() - t0)
        return statistics.median(times), statistics.fmean(times)


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
    (small, small_mean), (large, large_mean) = transaction_time(10), transaction_time(args.runs)
    ratio = large / small
    print(f"(3) one transaction's store cost (a renewal + a chunk's record, not fsync'd): "
          f"{small * 1e3:.3f} ms at 10 runs, {large * 1e3:.3f} ms at {args.runs} runs "
          f"(ratio {ratio:.2f}; means with compactions {small_mean * 1e3:.3f} / "
          f"{large_mean * 1e3:.3f} ms)   target <= 2   [{'met' if ratio <= 2 else 'MISSED'}]")
    (small, _), (large, _) = (transaction_time(10, decide=True),
                              transaction_time(args.runs, decide=True))
    print(f"    with the scheduling decision (claim_next + finish): {small * 1e3:.3f} ms at 10 "
          f"runs, {large * 1e3:.3f} ms at {args.runs} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
