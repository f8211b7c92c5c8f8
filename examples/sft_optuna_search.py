"""Let Optuna's TPE propose the configs while others train, and its pruner stop the losers.

Offline, on a CPU (a tiny 2-layer Llama built locally and generated Q&A data, about 20 s on 2
CPU cores; needs ``pip install optuna``)::

    HF_HUB_OFFLINE=1 python examples/sft_optuna_search.py

The space is ``learning_rate=Range(1e-4, 1e-1, log=True)`` x ``lr_scheduler_type=List([...])``.
``OptunaSearch`` keeps ``--max-concurrent`` runs training, interleaved chunk by chunk; whenever
one leaves the rotation (completed, or stopped by the pruner) its result is told to the study
and TPE proposes the next config, until it has proposed ``--num-runs``. ``OptunaPruner`` asks
Optuna's successive halving pruner about every run at every chunk end; its "prune" is an
ordinary ``stop`` op, shown in the ``last op`` column. The study is kept in
``<output_dir>/.rapidfire/optuna.journal``: run the script again with the same
``--output-dir`` and a larger ``--num-runs`` to give the study more trials.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import optuna

from trl_rapidfire import List, OptunaPruner, OptunaSearch, Range, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.reports.display import table
from trl_rapidfire.reports.experiment_data import read_search_log
from trl_rapidfire.reports.report import results_table, search_rows
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", help="experiment folder (default: a new temp folder)")
    parser.add_argument("--rows", type=int, default=256, help="training rows (one epoch)")
    parser.add_argument("--num-chunks", type=int, default=4, help="chunks per run")
    parser.add_argument("--num-runs", type=int, default=8, help="configs TPE proposes")
    parser.add_argument("--max-concurrent", type=int, default=2, help="runs training at once")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Any:
    """Run the search, print the runs and what the sampler proposed; returns the trainer."""
    args = parse_args(argv)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-optuna-")
    steps_per_chunk = args.rows // 8 // args.num_chunks
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(
            output_dir=output_dir,
            learning_rate=Range(1e-4, 1e-1, log=True),
            lr_scheduler_type=List(["linear", "cosine", "constant"]),
            per_device_train_batch_size=8,
            per_device_eval_batch_size=32,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",
            **cpu_training_kwargs(),
        ),
        train_dataset=make_sft_dataset(args.rows, seed=1),
        eval_dataset=make_sft_dataset(64, seed=9),
        peft_config=tiny_lora_config(r=8),
        search=OptunaSearch(num_runs=args.num_runs, max_concurrent=args.max_concurrent,
                            metric="eval_loss", seed=args.seed),
        policy=OptunaPruner(optuna.pruners.SuccessiveHalvingPruner(
            min_resource=steps_per_chunk, reduction_factor=2)),
    )
    print(f"TPE proposes {args.num_runs} runs, {args.max_concurrent} at a time, "
          f"{args.num_chunks} chunks each; output in {output_dir}")
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    best = trainer.best_run
    print(f"\n=== {len(trainer.schedule)} chunks trained in {seconds:.1f} s ===\n")
    print(results_table(trainer.runs, {"eval_loss": "eval_loss"},
                        best=best.name if best else None))
    print("\nWhat the sampler proposed, when, and what the study was told (search.csv):")
    rows = search_rows(read_search_log(Layout(output_dir).search_log))
    print(table(["trial", "run", "proposed", "params", "told"], rows))
    if best is not None:
        print(f"\nBest run (*): {best.name}  {best.knobs}  "
              f"eval_loss={best.metrics.get('eval_loss', float('nan')):.4f}")
    return trainer


if __name__ == "__main__":
    main()
