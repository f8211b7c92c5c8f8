"""What MLflow tracking costs per run, at 8 runs and at 500: the part of an experiment that
``benchmarks/scaling.py`` leaves out (it trains with ``report_to="none"``).

For each ``--runs`` count, a fresh sqlite store and the Tracker an experiment uses, timing:

- **register**: ``ensure_run`` of every run (what ``train()`` does before training: find or
  create the MLflow run, log its whole SFT config as params), per run;
- **report**: one chunk's report of every run (a loss point and the status and progress
  tags, queued, then one flush), per run;
- **poll**: one poll of the control tags (the tracking thread's, every second while training)
  with one op set on one run;
- **re-register**: ``ensure_run`` of every run again in a new Tracker (a re-run of the
  script finds its runs), per run.

Prints the figures and, for each, the ratio of its cost per run at the largest count to the
smallest (measured in this invocation): near 1 for register/report/re-register (a cost per run
that does not grow with the runs), and for the poll the ratio of its whole cost (one poll
reads the runs that carry an op, not all of them: near 1 too).

Run: ``python benchmarks/tracking_scale.py`` (``--runs 8,500``; ``--quick``: 4 and 40).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def _config(folder: Path) -> dict:
    from trl import SFTConfig

    return SFTConfig(output_dir=str(folder / "out"), report_to="none", use_cpu=True,
                     bf16=False).to_dict()


def measure(runs: int, repeat: int) -> dict[str, float]:
    from trl_rapidfire.tracking.tags import OP_TAG
    from trl_rapidfire.tracking.tracker import Tracker

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        config = _config(folder)
        params = [dict(config, learning_rate=10.0 ** -(2 + i % 4),
                       output_dir=f"out/runs/run-{i}") for i in range(runs)]
        tracker = Tracker(folder / "exp", uri=uri)
        t0 = time.perf_counter()
        for i in range(runs):
            tracker.ensure_run(f"run-{i}", params[i], {"rapidfire.status": "pending"})
        register = (time.perf_counter() - t0) / runs
        reports = []
        for step in range(1, repeat + 1):
            t0 = time.perf_counter()
            now = int(time.time() * 1000)
            for i in range(runs):
                tracker.log_metrics(f"run-{i}", [("loss", 1.0 / (i + step), step, now)])
                tracker.set_tags(f"run-{i}", {"rapidfire.status": "running",
                                              "rapidfire.progress": f"chunk {step}"})
            tracker.flush(timeout=3600)
            reports.append((time.perf_counter() - t0) / runs)
        tracker.client.set_tag(tracker.run_id(f"run-{runs // 2}"), OP_TAG, "stop")
        polls = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            tracker.poll_now()
            polls.append(time.perf_counter() - t0)
        assert tracker.pending_ops() == {f"run-{runs // 2}": "stop"}, tracker.pending_ops()
        tracker.close()
        again = Tracker(folder / "exp", uri=uri)
        t0 = time.perf_counter()
        for i in range(runs):
            again.ensure_run(f"run-{i}", params[i], {"rapidfire.status": "pending"})
        reregister = (time.perf_counter() - t0) / runs
        again.close()
    return {"runs": runs, "register": register, "report": statistics.median(reports),
            "poll": statistics.median(polls), "reregister": reregister}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="8,500", help="run counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 and 40 runs")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    counts = [4, 40] if args.quick else [int(n) for n in args.runs.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; sqlite store; "
          "ms per run (poll: ms per poll)", flush=True)
    results = []
    for n in counts:
        r = measure(n, args.repeat)
        results.append(r)
        print(f"{n:5d} runs: register {r['register'] * 1000:6.1f}   report "
              f"{r['report'] * 1000:6.2f}   poll {r['poll'] * 1000:7.1f}   re-register "
              f"{r['reregister'] * 1000:6.1f}", flush=True)
    small, large = results[0], results[-1]
    print(f"{large['runs']} runs / {small['runs']} runs, per run: "
          + ", ".join(f"{k} {large[k] / small[k]:.2f}" for k in ("register", "report",
                                                               "reregister"))
          + f"; per poll: {large['poll'] / small['poll']:.2f}")


if __name__ == "__main__":
    main()
