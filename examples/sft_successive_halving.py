"""Let a policy stop the losers: 8 learning rates, successive halving at chunk boundaries.

Offline, on a CPU (a tiny 2-layer Llama built locally and generated Q&A data, about 20 s on 2
CPU cores)::

    HF_HUB_OFFLINE=1 python examples/sft_successive_halving.py

Each run is evaluated where the policy reads its eval loss and at its end
(``eval_strategy="policy"``). After each chunk, ``SuccessiveHalving`` (asynchronous successive
halving over chunks, eta=2) looks at the eval losses: at 1, 2 and 4 chunks a run continues only
if it is among the better half of the runs that got that far. Its decisions are ordinary
control ops, so they appear in the op log (``<output_dir>/ops.csv``, ``trainer.op_log``), on
each run's MLflow tags when tracking is on, and in the runs table below (the ``last op``
column). A stopped run can still be resumed by a person (``trainer.resume("run-3");
trainer.train()``) and then continues exactly.

With ``--budget-steps N`` a ``Budget`` joins the policy and stops every remaining run once the
runs have trained N steps in all.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from trl_rapidfire import Budget, List, RFSFTConfig, RFSFTTrainer, SuccessiveHalving
from trl_rapidfire.reports.report import chunk_timeline, results_table
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

# 8 rates over three orders of magnitude: the tiny model starts from random weights, so the
# small ones barely move its loss and the largest overshoot.
LEARNING_RATES = [1e-4, 2.7e-4, 7.2e-4, 1.9e-3, 5.2e-3, 1.4e-2, 3.7e-2, 1e-1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", help="experiment folder (default: a new temp folder)")
    parser.add_argument("--rows", type=int, default=512, help="training rows (one epoch)")
    parser.add_argument("--num-chunks", type=int, default=8, help="chunks per run")
    parser.add_argument("--eta", type=int, default=2, help="keep the best 1/eta at each rung")
    parser.add_argument("--budget-steps", type=int, help="also stop everything after N steps")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Any:
    """Run the experiment, print the runs with the policy's decisions; returns the trainer."""
    args = parse_args(argv)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-halving-")
    policy: Any = SuccessiveHalving(metric="eval_loss", mode="min", eta=args.eta)
    if args.budget_steps:
        policy = [policy, Budget(max_total_steps=args.budget_steps)]
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(
            output_dir=output_dir,
            learning_rate=List(LEARNING_RATES),
            lr_scheduler_type="linear",
            per_device_train_batch_size=8,
            per_device_eval_batch_size=32,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="policy",
            **cpu_training_kwargs(),
        ),
        train_dataset=make_sft_dataset(args.rows, seed=1),
        eval_dataset=make_sft_dataset(64, seed=9),
        peft_config=tiny_lora_config(r=8),
        policy=policy,
    )
    print(f"{len(trainer.runs)} runs, {args.num_chunks} chunks each, output in {output_dir}")
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    chunks = len(trainer.schedule)
    total = sum(args.num_chunks for _ in trainer.runs)
    best = trainer.best_run
    print(f"\n=== {chunks} of {total} chunks trained in {seconds:.1f} s ===\n")
    print(results_table(trainer.runs, {"eval_loss": "eval_loss"},
                        best=best.name if best else None))
    if best is not None:
        print(f"\nBest run (*): {best.name}  learning_rate={best.knobs['learning_rate']:g}  "
              f"eval_loss={best.metrics.get('eval_loss', float('nan')):.4f}  "
              f"adapter in {best.final_dir}")
    print("\nChunk timeline (one column per chunk trained, in order):")
    print(chunk_timeline(trainer.runs, trainer.schedule))
    return trainer


if __name__ == "__main__":
    main()
