"""Draw the report of a small experiment: learning curves with every op marked, the chunk
schedule, and the runs ranked.

Offline, on a CPU (the tiny 2-layer Llama built locally and generated Q&A data, about a minute
on 2 CPU cores)::

    HF_HUB_OFFLINE=1 python examples/report_plots.py --out report/

Six learning rates train in 4 chunks each, evaluated at every chunk end; ``SuccessiveHalving``
stops the worse half at 1 and 2 chunks (hollow markers: a policy's decisions). Then a person
warm-clones the best run with a third of its learning rate (a filled star on the parent's
curves) and trains the clone. The experiment is tracked in MLflow (a sqlite store inside the
experiment folder unless ``MLFLOW_TRACKING_URI`` is set; ``--no-mlflow`` draws from the
runs' ``trainer_state.json`` files instead), and the report is what
``trl-rapidfire report OUTPUT_DIR --out DIR`` writes: ``learning_curves.png``,
``schedule.png`` and ``summary.md``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer, SuccessiveHalving
from trl_rapidfire.reports.plots import write_report
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

# Two orders of magnitude: on the tiny model the smallest barely move the loss and the
# largest overshoot, so the halving has clear losers.
LEARNING_RATES = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the report")
    parser.add_argument("--output-dir", help="experiment folder (default: a new temp folder)")
    parser.add_argument("--rows", type=int, default=256, help="training rows (one epoch)")
    parser.add_argument("--num-chunks", type=int, default=4, help="chunks per run")
    parser.add_argument("--no-mlflow", action="store_true", help="train without tracking")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> tuple[Any, Any]:
    """Train, write the report, print its paths; returns the trainer and the report files."""
    args = parse_args(argv)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-report-")
    uri = None
    if not args.no_mlflow:
        uri = os.environ.setdefault("MLFLOW_TRACKING_URI",
                                    f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}")
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(
            output_dir=output_dir,
            learning_rate=List(LEARNING_RATES),
            per_device_train_batch_size=8,
            per_device_eval_batch_size=32,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",
            logging_steps=1,
            **{**cpu_training_kwargs(), "report_to": "none" if args.no_mlflow else "mlflow"},
        ),
        train_dataset=make_sft_dataset(args.rows, seed=1),
        eval_dataset=make_sft_dataset(64, seed=9),
        peft_config=tiny_lora_config(r=8),
        policy=SuccessiveHalving(metric="eval_loss", mode="min", eta=2),
    )
    trainer.train()
    best = trainer.best_run
    trainer.clone(best.name, {"learning_rate": best.knobs["learning_rate"] / 3}, warm=True)
    trainer.train()

    files = write_report(output_dir, args.out, metric="eval_loss", tracking_uri=uri)
    print(f"experiment in {output_dir}; metrics from {files.source_detail}")
    print(f"best first: {', '.join(files.ranking)}")
    for path in files.paths:
        print(path)
    return trainer, files


if __name__ == "__main__":
    main()
