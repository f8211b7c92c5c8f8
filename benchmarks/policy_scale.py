"""What a policy's decision costs per chunk boundary as the number of runs grows.

An experiment of N runs of C chunks is played on one worker with the scheduler's rule (the run
with the least progress next), without training: each boundary replaces the one run that moved
in the experiment's kept :class:`~trl_rapidfire.control.policies.Context` (as the engine's
``PolicyView`` does), asks the policy about it, and applies its stops. Timed: the context's
update and the decision, per boundary, best of ``--repeats``. Printed per policy: microseconds a
boundary at each N and the ratio to the smallest N (the target: at most 1.2 from 8 to 512 runs;
before the kept context and the rung index, every boundary copied and scanned every run's
history: O(N) a boundary, O(N^2) an experiment).

Usage::

    python benchmarks/policy_scale.py                       # N = 8, 512, 2048; 16 chunks
    python benchmarks/policy_scale.py --quick               # N = 8, 64; 8 chunks: a smoke test
    python benchmarks/policy_scale.py --runs 8 512 --chunks 64 --repeats 5
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable

from trl_rapidfire.control.policies import (
    Context,
    Hyperband,
    Policy,
    PopulationBased,
    RunHistory,
    SuccessiveHalving,
)
from trl_rapidfire.shared_state.runs import RunStatus

STEPS = 4  # steps a chunk (the histories' step numbers)


def history(name: str, values: list[float], total: int, status: RunStatus) -> RunHistory:
    log = tuple({"step": STEPS * (i + 1), "eval_loss": v} for i, v in enumerate(values))
    return RunHistory(name, status, len(values), total,
                      tuple(STEPS * (i + 1) for i in range(total)), log)


def play(policy: Policy, runs: int, chunks: int, seed: int = 0) -> tuple[float, int]:
    """Seconds spent in context updates and decisions, and the boundaries played."""
    rng = random.Random(seed)
    quality = {f"run-{i}": rng.random() for i in range(runs)}
    values: dict[str, list[float]] = {name: [] for name in quality}
    status = dict.fromkeys(quality, RunStatus.PENDING)
    context = Context({n: history(n, [], chunks, RunStatus.PENDING) for n in quality})
    order = {name: i for i, name in enumerate(quality)}
    # The rotation by (chunks done, order): the run with the least progress next.
    waiting = sorted(quality, key=order.__getitem__)
    spent, boundaries = 0.0, 0
    while waiting:
        name = waiting.pop(0)
        if not status[name].schedulable:
            continue
        chunk = len(values[name]) + 1
        values[name].append(quality[name] + 1.0 / chunk)
        status[name] = RunStatus.COMPLETED if chunk == chunks else RunStatus.RUNNING
        moved = history(name, values[name], chunks, status[name])
        started = time.perf_counter()
        context.update([moved], 0.0)
        decisions = policy.on_chunk_end(name, context)
        spent += time.perf_counter() - started
        boundaries += 1
        stopped = []
        for d in decisions:
            if d.action in ("stop", "fail") and status[d.run].schedulable:
                status[d.run] = RunStatus.STOPPED if d.action == "stop" else RunStatus.FAILED
                stopped.append(history(d.run, values[d.run], chunks, status[d.run]))
        started = time.perf_counter()
        context.update(stopped, 0.0)
        spent += time.perf_counter() - started
        if status[name] == RunStatus.RUNNING:
            waiting.append(name)
    return spent, boundaries


def policies() -> dict[str, Callable[[], Policy]]:
    return {
        "SuccessiveHalving(eta=2)": lambda: SuccessiveHalving(eta=2),
        "Hyperband(eta=2)": lambda: Hyperband(eta=2),
        "PopulationBased(interval 2)": lambda: PopulationBased(
            interval_chunks=2, mutations={"learning_rate": 2.0}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[8, 512, 2048])
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="N = 8, 64; 8 chunks; 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.chunks, args.repeats = [8, 64], 8, 1
    print(f"policy cost per boundary: runs {args.runs}, {args.chunks} chunks a run, one "
          f"worker, best of {args.repeats}")
    for label, make in policies().items():
        per: dict[int, float] = {}
        for runs in args.runs:
            best = min((play(make(), runs, args.chunks) for _ in range(args.repeats)),
                       key=lambda r: r[0] / r[1])
            per[runs] = best[0] / best[1]
        base = per[args.runs[0]]
        cells = ", ".join(f"N={n}: {1e6 * us:.1f} us ({us / base:.2f}x)" for n, us in per.items())
        print(f"  {label:28s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
