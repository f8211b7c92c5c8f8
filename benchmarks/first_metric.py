"""How long a user waits for the first learning curve point as the number of configs grows.

The time-to-best workload (``benchmarks/time_to_best.py``: the tiny model, LoRA r=8 on q,v,
1024 rows, 32 eval rows, ``SuccessiveHalving(eta=2)``, ``eval_strategy="policy"``, MLflow on a
new sqlite store) is constructed with N learning rates and trained until the first evaluation
of the first chunk has been logged; then the experiment stops (as a Ctrl-C would). Timed:
construction (the ``RFSFTTrainer(...)`` call) and the first metric (construction start to that
first evaluation). Each N runs in this process after an untimed warm-up (imports, MLflow's
first use), in alternating order over ``--repeats``; each N's best is kept. Printed: the
seconds at each N and the ratio to the smallest N (the issue's targets: at most 2 at 128 runs
and 3 at 1000 against 8).

Usage::

    python benchmarks/first_metric.py                         # N = 8, 128, 1000
    python benchmarks/first_metric.py --configs 8 128 --repeats 3
    python benchmarks/first_metric.py --quick                 # N = 2, 8: a smoke test
    python benchmarks/first_metric.py --configs 1000 --profile 25   # where the time goes

Runs offline on CPU (``HF_HUB_OFFLINE=1`` is set).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import time_to_best as bench  # noqa: E402 - the shared workload
from time_to_best_sides import env, new_store  # noqa: E402


def rates(n: int) -> list[float]:
    """``n`` distinct learning rates, log-spaced over the time-to-best range (6 digits: the
    workload's 3-digit rounding repeats values beyond a few hundred configs)."""
    lo, hi = bench.LR_MIN, bench.LR_MAX
    return [float(f"{lo * (hi / lo) ** (i / max(n - 1, 1)):.6g}") for i in range(n)]


def first_metric(n: int, chunks: int, rows: int, report_to: str, folder: str,
                 profile: cProfile.Profile | None = None) -> tuple[float, float]:
    """Construct an experiment of ``n`` configs and train it to its first evaluation.
    Returns (construction seconds, first metric seconds)."""
    from transformers import TrainerCallback

    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer, SuccessiveHalving
    from trl_rapidfire.testing import make_sft_dataset, tiny_model_path

    seen: list[float] = []
    holder: dict[str, Any] = {}

    class FirstEvaluation(TrainerCallback):
        """Notes when the first evaluation is logged and stops the experiment there."""

        def on_evaluate(self, args, state, control, **kwargs):
            if not seen:
                seen.append(time.perf_counter())
                holder["rf"].engine.interrupted = True  # what a first Ctrl-C sets

    uri, _ = new_store(f"{folder}/store") if report_to == "mlflow" else ("", 0.0)
    train, evals = make_sft_dataset(rows, seed=1), make_sft_dataset(bench.SWEEP_EVAL_ROWS, seed=9)
    with env(MLFLOW_TRACKING_URI=uri or None, MLFLOW_EXPERIMENT_NAME=None), bench.quiet(), \
            bench.warnings_off():
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        rf = RFSFTTrainer(
            model=tiny_model_path(),
            args=RFSFTConfig(output_dir=f"{folder}/experiment",
                             learning_rate=List(rates(n)), num_chunks=chunks,
                             eval_strategy="policy", **bench.shared_kwargs(report_to)),
            train_dataset=train, eval_dataset=evals, peft_config=bench.lora(),
            policy=SuccessiveHalving("eval_loss", eta=bench.ETA),
            callbacks=[FirstEvaluation()],
        )
        t1 = time.perf_counter()
        holder["rf"] = rf
        try:
            rf.train()
        except KeyboardInterrupt:  # stopped at the boundary after the first evaluation
            pass
        if profile is not None:
            profile.disable()
    if not seen:
        raise RuntimeError("no evaluation was logged")
    del rf, holder["rf"]
    gc.collect()
    return t1 - t0, seen[0] - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", type=int, nargs="+", default=[8, 128, 1000])
    p.add_argument("--chunks", type=int, default=64)
    p.add_argument("--rows", type=int, default=bench.DEFAULT_ROWS)
    p.add_argument("--report-to", default="mlflow", choices=["mlflow", "none"])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="N = 2, 8 on 64 rows, 4 chunks")
    p.add_argument("--profile", type=int, metavar="LINES", default=0,
                   help="profile the largest N's last repetition; print its top LINES")
    args = p.parse_args(argv)
    if args.quick:
        args.configs, args.chunks, args.rows = [2, 8], 4, 64
    import datasets
    import torch
    from transformers.utils import logging as hf_logging

    # A tokenization bar per dataset and a weights bar per model load would bury the figures.
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    sizes = sorted(set(args.configs))
    print(f"first metric: tiny model, {args.rows} rows, {args.chunks} chunks, "
          f"SuccessiveHalving(eta={bench.ETA}), eval_strategy='policy', "
          f"report_to={args.report_to!r}, {args.threads} thread(s)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        first_metric(2, 2, 32, args.report_to, f"{tmp}/warm")  # untimed: imports, first uses
        best: dict[int, tuple[float, float]] = {}
        profile = cProfile.Profile() if args.profile else None
        for repeat in range(args.repeats):
            order = sizes if repeat % 2 == 0 else sizes[::-1]
            for n in order:
                last = profile if n == sizes[-1] and repeat == args.repeats - 1 else None
                got = first_metric(n, args.chunks, args.rows, args.report_to,
                                   f"{tmp}/r{repeat}-{n}", last)
                print(f"  N={n:5d}: construction {got[0]:6.2f} s, first metric {got[1]:6.2f} s",
                      flush=True)
                best[n] = min(best.get(n, got), got, key=lambda g: g[1])
    base = best[sizes[0]][1]
    print(f"\n{'N':>6} | construction | first metric | ratio to N={sizes[0]}")
    for n in sizes:
        build, first = best[n]
        print(f"{n:6d} | {build:10.2f} s | {first:10.2f} s | {first / base:6.2f}")
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.profile)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
