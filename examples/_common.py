"""What the ``*_multi_config.py`` examples share, so that each of them shows only its trainer:
the command line, the data (generated, or ``--dataset``), the settings that differ between the
tiny offline model on a CPU and a real model on a GPU, and the ranking printed at the end."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, load_dataset
from peft import LoraConfig

from trl_rapidfire.reports.report import chunk_timeline, results_table
from trl_rapidfire.testing import cpu_training_kwargs, tiny_model_path

DATA_FILES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def command_line(doc: str, argv: Sequence[str] | None, *, rows: int, num_chunks: int = 2,
                 **more: str) -> argparse.Namespace:
    """``--model``, ``--dataset``, ``--rows``, ``--num-chunks``, ``--output-dir`` and an option
    per ``more`` (its name: its help); then ``args.tiny`` (no ``--model``: the tiny offline
    model, whose path ``args.model`` holds)."""
    title, _, details = doc.partition("\n")
    parser = argparse.ArgumentParser(description=title, epilog=details,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a Hub name or local path (default: the tiny model)")
    parser.add_argument("--dataset", help="a Hub dataset or a .json/.jsonl/.csv/.parquet file "
                        "in this trainer's columns (default: generated rows)")
    parser.add_argument("--rows", type=int, default=rows, help="rows, a fifth held out for eval")
    parser.add_argument("--num-chunks", type=int, default=num_chunks,
                        help="chunks per epoch of each run")
    parser.add_argument("--output-dir", help="experiment folder (default: a new temp folder)")
    for name, text in more.items():
        parser.add_argument(f"--{name}", help=text)
    args = parser.parse_args(argv)
    if args.rows < 10:
        parser.error("--rows must be at least 10 (a fifth is held out for evaluation)")
    args.tiny = args.model is None
    args.model = args.model or tiny_model_path()
    args.output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-example-")
    return args


def splits(args: argparse.Namespace, make: Callable[[int], Dataset],
           *columns: Sequence[str]) -> tuple[Dataset, Dataset]:
    """Train and eval rows, a fifth held out: ``make(args.rows)``'s, or ``--dataset``'s, kept
    to the first of ``columns`` (alternative column sets the trainer reads) it has."""
    if args.dataset is None:
        dataset = make(args.rows)
    else:
        builder = DATA_FILES.get(Path(args.dataset).suffix)
        dataset = (load_dataset(builder, data_files=args.dataset, split="train") if builder
                   else load_dataset(args.dataset, split="train"))
        keep = next((list(c) for c in columns if set(c) <= set(dataset.column_names)), None)
        if keep is None:
            wanted = " or ".join(map(str, columns))
            raise SystemExit(f"{args.dataset}: expected {wanted}, found {dataset.column_names}")
        dataset = dataset.select_columns(keep).shuffle(seed=0)
        dataset = dataset.select(range(min(args.rows, len(dataset))))
    parts = dataset.train_test_split(test_size=0.2, seed=0)
    return parts["train"], parts["test"]


def device_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The tiny model: fp32 CPU settings. A real model: bf16 where the GPU has it. Either way no
    intermediate checkpoints (each run's final adapter is saved all the same), no tracking."""
    if args.tiny:
        return {**cpu_training_kwargs(), "disable_tqdm": False}  # show the progress bar
    return {"bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
            "report_to": "none", "save_strategy": "no"}


def lora(args: argparse.Namespace, r: int, task_type: str = "CAUSAL_LM") -> LoraConfig:
    """A LoRA adapter of rank ``r``: on the tiny model's q/v projections, else on q/k/v/o."""
    targets = ["q_proj", "v_proj"] if args.tiny else ["q_proj", "k_proj", "v_proj", "o_proj"]
    return LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, task_type=task_type)


def ranking(trainer: Any) -> list[Any]:
    """The runs best first by the config's ``metric_for_best_model`` and ``greater_is_better``
    (as ``trainer.best_run`` judges), runs without a value last; ties keep declaration order."""
    metric = trainer.args.metric_for_best_model
    sign = -1.0 if trainer.args.greater_is_better else 1.0
    return sorted(trainer.runs, key=lambda run: (metric not in run.metrics,
                                                 sign * run.metrics.get(metric, 0.0)))


def print_ranking(trainer: Any) -> None:
    """The runs best first, the best run, and which run trained which chunk when."""
    metric = trainer.args.metric_for_best_model
    best = trainer.best_run
    header = metric if len(metric) <= 24 else "metric"
    print(f"\nRuns, best first by {metric}:")
    print(results_table(ranking(trainer), {header: metric}, best=best.name))
    print(f"\nBest run: {best.name} ({metric}={best.metrics.get(metric, float('nan')):.4g}), "
          f"its adapter in {best.final_dir}")
    print("\nChunk timeline (a column per chunk trained, in order; digit: the run's own chunk):")
    print(chunk_timeline(trainer.runs, trainer.schedule, steps=True))
