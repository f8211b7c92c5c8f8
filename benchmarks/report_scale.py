"""How long ``trl-rapidfire report`` takes, and what it draws, at 100 and 500 runs.

A synthetic experiment folder is written (no training): N runs with five knobs (learning rate
on a log grid, scheduler, batch size, LoRA rank, warmup), a training-loss curve per run whose
level the learning rate decides (the other knobs add little), ``eval_loss`` and
``eval_accuracy`` every 10 steps (their best learning rates differ, so the two trade off), a
successive-halving policy's stops in ``ops.csv`` (half the runs after 50 steps, half of the
rest after 100), and a 4-worker ``schedule.csv``; no MLflow store, so the metrics are read from
the runs' ``trainer_state.json`` as for ``report_to="none"``. Then ``write_report`` is timed
(best of ``--repeats``), once with ``--metric eval_loss`` and once with two metrics
(``eval_loss,accuracy``: the Pareto front too).

Usage::

    python benchmarks/report_scale.py                    # N = 100, 500
    python benchmarks/report_scale.py --runs 33 --repeats 1
    python benchmarks/report_scale.py --docs docs/img    # the docs' figures (100 runs)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# pylint: disable=wrong-import-position
from trl_rapidfire.reports.experiment_data import ExperimentData, OpEvent, RunData  # noqa: E402
from trl_rapidfire.reports.plots import write_report  # noqa: E402
from trl_rapidfire.storage.schedule import ChunkRecord, write_schedule_csv  # noqa: E402

LORA = "LoraConfig(r={r}, alpha={alpha}, targets=['q_proj', 'v_proj'])"
STEPS = 200
CHUNK = 50
EVAL_EVERY = 10


def synthetic_runs(count: int, seed: int = 0) -> ExperimentData:
    """An experiment of ``count`` runs, in memory (see the module's docstring)."""
    rng = random.Random(seed)
    runs: dict[str, RunData] = {}
    ops: list[OpEvent] = []
    finals = {}
    for i in range(count):
        lr = 10 ** rng.choice([-5 + k / 4 for k in range(13)])  # 1e-5 .. 1e-2
        r = rng.choice([4, 8, 16, 32])
        knobs = {"learning_rate": lr, "lr_scheduler_type": rng.choice(["linear", "cosine",
                                                                        "constant"]),
                 "per_device_train_batch_size": rng.choice([8, 16, 32]),
                 "peft_config": LORA.format(r=r, alpha=2 * r),
                 "warmup_ratio": rng.choice([0.0, 0.05, 0.1])}
        # The learning rate decides: best near 3e-4; a larger rank helps some.
        final = 0.9 + 0.35 * (math.log10(lr) + 3.5) ** 2 - 0.04 * math.log2(r)
        finals[f"run-{i}"] = (final, lr)
        runs[f"run-{i}"] = RunData(f"run-{i}", "completed", STEPS, knobs, {}, "disk")
    # Successive halving at steps 50 and 100: the worse half of the runs still going stops.
    alive = sorted(runs, key=lambda n: finals[n][0])
    ends = dict.fromkeys(runs, STEPS)
    clock = 1000.0
    for rung in (50, 100):
        keep = alive[:max(1, len(alive) // 2)]
        for name in alive[len(keep):]:
            ends[name] = rung
            clock += 0.01
            ops.append(OpEvent(clock, "policy:SuccessiveHalving", name, "stop",
                               f"ok: stopped at step {rung} by SuccessiveHalving rung "
                               f"{rung // 50 - 1}: eval_loss not in best half"))
        alive = keep
    for name, run in runs.items():
        final, lr = finals[name]
        tau = 20 + 8 * abs(math.log10(lr) + 2)
        noise = random.Random(int(name.split("-")[1]) * 7919 + seed)
        loss = [(s, final + (2.6 - final) * math.exp(-s / tau) + noise.gauss(0, 0.03))
                for s in range(1, ends[name] + 1)]
        evals = [s for s in range(EVAL_EVERY, ends[name] + 1, EVAL_EVERY)]
        run.history = {
            "loss": loss,
            "eval_loss": [(s, loss[s - 1][1] + 0.06) for s in evals],
            # Best learning rate 3e-3 here, 3e-4 for the loss: the two objectives trade off.
            "eval_accuracy": [(s, 0.85 - 0.08 * (math.log10(lr) + 2.5) ** 2
                               - 0.3 * math.exp(-s / tau) + noise.gauss(0, 0.01))
                              for s in evals],
        }
        run.steps = ends[name]
        run.status = "completed" if ends[name] == STEPS else "stopped"
    schedule = []
    free = [0.0] * 4
    for k in range(STEPS // CHUNK):
        for i, name in enumerate(runs):
            if ends[name] <= k * CHUNK:
                continue
            worker = min(range(4), key=lambda w: free[w])
            seconds = 2.0 + (i % 7) * 0.1
            schedule.append(ChunkRecord(name, 0, k, k, worker, 1000 + free[worker],
                                        1000 + free[worker] + seconds, k * CHUNK,
                                        (k + 1) * CHUNK))
            free[worker] += seconds
    return ExperimentData(Path("synthetic"), f"synthetic-{count}", runs, schedule, ops, "disk",
                          "the runs' trainer_state.json files (synthetic)")


def write_experiment(data: ExperimentData, root: Path) -> None:
    """Write ``data`` as an experiment folder a report reads without MLflow."""
    root.mkdir(parents=True, exist_ok=True)
    write_schedule_csv(data.schedule, root / "schedule.csv")
    with open(root / "ops.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["time", "source", "run", "op", "result"])
        for op in data.ops:
            writer.writerow([op.time, op.source, op.run, op.op, op.result])
    (root / ".rapidfire").mkdir(exist_ok=True)
    (root / ".rapidfire" / "scheduler.json").write_text(json.dumps({"runs": {
        name: {"status": run.status, "global_step": run.steps, "knobs": run.knobs}
        for name, run in data.runs.items()}}), encoding="utf-8")
    for name, run in data.runs.items():
        entries: dict[int, dict[str, float]] = {}
        for key, points in run.history.items():
            for step, value in points:
                entries.setdefault(step, {"step": step})[key] = value
        folder = root / "runs" / name / "final"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "trainer_state.json").write_text(
            json.dumps({"log_history": [entries[s] for s in sorted(entries)]}),
            encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Time ``write_report`` at each ``--runs`` (or write the docs' figures)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--docs", type=Path, help="write the figures of 100 runs here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.docs:
            write_experiment(synthetic_runs(100), Path(tmp) / "exp")
            files = write_report(Path(tmp) / "exp", Path(tmp) / "report",
                                 metric="eval_loss,accuracy", tracking_uri=f"sqlite:///{tmp}/n.db")
            args.docs.mkdir(parents=True, exist_ok=True)
            for path, name in ((files.learning_curves, "report_curves_100.png"),
                               (files.schedule, "report_schedule_100.png"),
                               (files.why_wins, "report_why_wins_100.png"),
                               (files.pareto, "report_pareto_100.png")):
                assert path is not None
                (args.docs / name).write_bytes(path.read_bytes())
                print(args.docs / name)
            return 0
        # Wall seconds, and this process's CPU seconds (less swayed by other busy processes).
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"{'runs':>5} {'metric':<20} {'wall s':>8} {'cpu s':>8}")
        for count in args.runs:
            exp = Path(tmp) / f"exp-{count}"
            write_experiment(synthetic_runs(count), exp)
            for metric in ("eval_loss", "eval_loss,accuracy"):
                best, cpu = math.inf, math.inf
                for _ in range(args.repeats):
                    start, start_cpu = time.perf_counter(), time.process_time()
                    write_report(exp, Path(tmp) / f"report-{count}", metric=metric,
                                 tracking_uri=f"sqlite:///{tmp}/none.db")
                    best = min(best, time.perf_counter() - start)
                    cpu = min(cpu, time.process_time() - start_cpu)
                print(f"{count:>5} {metric:<20} {best:>8.2f} {cpu:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
