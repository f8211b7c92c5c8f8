"""CLI start-up benchmark: wall time of `trl-rapidfire --help`, `status` and an op (`stop`) on
a local sqlite store holding one training experiment of ``--runs`` runs, each a fresh process
as a person's shell starts it; against the same reads and the tag write done through
``MlflowClient`` in a fresh process (what the CLI did before tracked_runs.py).

Run: ``python benchmarks/cli_startup.py`` (``--repeat 5``; ``--quick`` for a smoke run).
Prints the median seconds of each command and its ratio to the MlflowClient baseline measured
in the same invocation. Target (issue 19): every command that needs no model under 2 s on a
2-core machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_BASELINE = """
import sys
from mlflow import MlflowClient
uri, = sys.argv[1:]
client = MlflowClient(uri)
ids = [e.experiment_id for e in client.search_experiments()]
runs = client.search_runs(ids, "tags.`rapidfire.role` = 'run'", max_results=1000)
client.set_tag(runs[0].info.run_id, "rapidfire.op", "stop")
"""


def _store(folder: Path, runs: int) -> str:
    """A store as a training experiment leaves it: parent run with a fresh heartbeat, runs
    with their status tags and a few metrics."""
    from trl_rapidfire.tracking.tracker import Tracker

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracker = Tracker(folder / "demo", uri=uri)
    for i in range(runs):
        tracker.ensure_run(f"run-{i}", {"learning_rate": 10.0 ** -(i % 5)},
                           {"rapidfire.status": "running"})
        tracker.log_metrics(f"run-{i}", [("loss", 1.0 / (i + 1), 1, int(time.time() * 1000))])
    tracker.experiment_started()
    tracker.flush()
    return uri


def _timed(argv: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed: {proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="4 runs, once each (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.repeat = 4, 1
    cli = [sys.executable, "-m", "trl_rapidfire.client.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        uri = _store(folder, args.runs)
        env_uri = ["--uri", uri]
        commands = {
            "--help": [*cli, "--help"],
            "status": [*cli, "status", *env_uri],
            "stop run-1": [*cli, "stop", "run-1", *env_uri],
            "MlflowClient (baseline)": [sys.executable, "-c", _BASELINE, uri],
        }
        medians = {}
        for name, argv in commands.items():
            times = [_timed(argv, folder) for _ in range(args.repeat)]
            medians[name] = statistics.median(times)
        base = medians["MlflowClient (baseline)"]
        print(f"{args.runs} runs, median of {args.repeat} fresh processes, {os.cpu_count()} "
              "CPUs")
        print(f"{'command':<26}{'seconds':>9}{'vs baseline':>13}")
        for name, seconds in medians.items():
            print(f"{name:<26}{seconds:>9.2f}{seconds / base:>13.2f}")


if __name__ == "__main__":
    main()
