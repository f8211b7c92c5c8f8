"""What a policy's decision costs per chunk boundary as the number of runs grows.

An experiment of N runs of C chunks is played on one worker with the scheduler's rule (the run
with the least progress next), without training: each boundary replaces the one run that moved
in the experiment's kept :class:`~trl_rapidfire.control.policies.Context` (as the engine's
``PolicyView`` does), asks the policy about it, and applies its stops. Timed: the context's
update and the decision, per boundary, over ``--seeds`` experiments, best of ``--repeats``.
Printed per policy: microseconds a boundary at each N and the ratio to the smallest N, for all
boundaries and for each kind apart: *quiet* ones (the policy decided nothing) and *deciding*
ones (it stopped or cloned a run). The target is at most 1.2 from 8 to 512 runs for boundaries
of the same kind. The ratio over all boundaries also moves with the mix: a larger experiment
decides at a larger share of its boundaries (Hyperband: 4% of them at 8 runs, 11% at 512; a
deciding boundary costs about four quiet ones), which is work per change, not per run. Before
the kept context and the rung index, every boundary copied and scanned every run's history:
O(N) a boundary, O(N^2) an experiment.

Usage::

    python benchmarks/policy_scale.py                       # N = 8, 512, 2048; 16 chunks
    python benchmarks/policy_scale.py --quick               # N = 8, 64; 8 chunks: a smoke test
    python benchmarks/policy_scale.py --runs 8 512 --chunks 64 --repeats 5
"""

from __future__ import annotations

import argparse
import math
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


def play(policy: Policy, runs: int, chunks: int, seed: int = 0) -> dict[bool, tuple[float, int]]:
    """Seconds spent in context updates and decisions, and the boundaries played, for the
    boundaries where the policy decided something (``True``) and those where it did not."""
    rng = random.Random(seed)
    quality = {f"run-{i}": rng.random() for i in range(runs)}
    values: dict[str, list[float]] = {name: [] for name in quality}
    status = dict.fromkeys(quality, RunStatus.PENDING)
    context = Context({n: history(n, [], chunks, RunStatus.PENDING) for n in quality})
    order = {name: i for i, name in enumerate(quality)}
    # The rotation by (chunks done, order): the run with the least progress next.
    waiting = sorted(quality, key=order.__getitem__)
    spent = {True: 0.0, False: 0.0}
    boundaries = {True: 0, False: 0}
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
        elapsed = time.perf_counter() - started
        stopped = []
        for d in decisions:
            if d.action in ("stop", "fail") and status[d.run].schedulable:
                status[d.run] = RunStatus.STOPPED if d.action == "stop" else RunStatus.FAILED
                stopped.append(history(d.run, values[d.run], chunks, status[d.run]))
        started = time.perf_counter()
        context.update(stopped, 0.0)
        elapsed += time.perf_counter() - started
        spent[bool(decisions)] += elapsed
        boundaries[bool(decisions)] += 1
        if status[name] == RunStatus.RUNNING:
            waiting.append(name)
    return {kind: (spent[kind], boundaries[kind]) for kind in (True, False)}


def policies() -> dict[str, Callable[[], Policy]]:
    return {
        "SuccessiveHalving(eta=2)": lambda: SuccessiveHalving(eta=2),
        "Hyperband(eta=2)": lambda: Hyperband(eta=2),
        "PopulationBased(interval 2)": lambda: PopulationBased(
            interval_chunks=2, mutations={"learning_rate": 2.0}),
    }


def measure(make: Callable[[], Policy], runs: int, chunks: int, seeds: int, repeats: int
            ) -> dict[str, tuple[float, int]]:
    """Seconds a boundary and boundaries played, over ``seeds`` experiments, the best of
    ``repeats`` (per kind): ``all``, ``quiet`` (nothing decided), ``deciding``."""
    best: dict[str, tuple[float, int]] = {}
    for _ in range(repeats):
        sums = {True: [0.0, 0], False: [0.0, 0]}
        for seed in range(seeds):
            for kind, (spent, count) in play(make(), runs, chunks, seed).items():
                sums[kind][0] += spent
                sums[kind][1] += int(count)
        total = (sums[True][0] + sums[False][0], sums[True][1] + sums[False][1])
        for label, (spent, count) in (("all", total), ("quiet", sums[False]),
                                      ("deciding", sums[True])):
            per = spent / count if count else math.nan
            if label not in best or per < best[label][0]:
                best[label] = (per, int(count))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[8, 512, 2048])
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=8,
                        help="experiments (random qualities) played per measurement")
    parser.add_argument("--quick", action="store_true", help="N = 8, 64; 8 chunks; 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.chunks, args.repeats, args.seeds = [8, 64], 8, 1, 2
    print(f"policy cost per boundary: runs {args.runs}, {args.chunks} chunks a run, one "
          f"worker, {args.seeds} experiments a measurement, best of {args.repeats}")
    for label, make in policies().items():
        per = {n: measure(make, n, args.chunks, args.seeds, args.repeats) for n in args.runs}
        base = per[args.runs[0]]
        print(f"  {label}")
        for kind in ("all", "quiet", "deciding"):
            cells = []
            for n, figures in per.items():
                us, count = figures[kind]
                ratio = us / base[kind][0] if base[kind][1] and count else math.nan
                cells.append(f"N={n}: {1e6 * us:5.1f} us ({ratio:.2f}x, {count} b.)")
            print(f"    {kind:9s}" + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
