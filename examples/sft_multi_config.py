"""Compare several SFT configs at once: 2 learning rates x 2 LoRA ranks, trained chunk by chunk.

Offline, on a CPU (the default: a tiny 2-layer Llama built locally and generated Q&A data,
20-30 s on 2 CPU cores)::

    HF_HUB_OFFLINE=1 python examples/sft_multi_config.py

On a GPU, with a real model (a Hub name or a local path) and a small real dataset (a Hub name,
a local dataset folder, or a .json/.jsonl/.csv/.parquet file with ``text``, ``messages`` or
``prompt``/``completion`` columns; without ``--dataset`` the generated data is used)::

    python examples/sft_multi_config.py --model meta-llama/Llama-3.2-1B-Instruct \\
        --dataset trl-lib/Capybara --rows 2000 --epochs 1 --output-dir ./rapidfire-sft-example

The 4 runs take turns: each epoch of each run is cut into ``--num-chunks`` chunks, every run
trains its first chunk before any run trains its second, and every run is evaluated on a
held-out split at each chunk end (``eval_strategy="chunk"``). Each run still ends exactly as it
would have trained alone with TRL's ``SFTTrainer``. At the end the script prints a table of the
runs, the best run (lowest eval loss), where each run's adapter was saved, and the order in
which the chunks were trained.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch
from datasets import Dataset, load_dataset
from peft import LoraConfig
from transformers import TrainingArguments

from trl_rapidfire import List, RFSFTConfig
from trl_rapidfire.reports.report import chunk_timeline
from trl_rapidfire.reports.report import results_table as table_of_runs
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

# Learning rates that make a visible difference within a few dozen steps: the tiny model starts
# from random weights and needs large ones; a pretrained model needs the usual LoRA range.
TINY_LEARNING_RATES = [5e-3, 1e-3]
REAL_LEARNING_RATES = [2e-4, 5e-5]
TINY_LORA_RANKS = [4, 16]
REAL_LORA_RANKS = [8, 32]
EVAL_FRACTION = 0.2
_DATA_FILE_BUILDERS = {
    ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text",
}  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Offline by default; see the module docstring for a GPU run.",
    )
    parser.add_argument("--model", help="Hub name or local path of a causal LM "
                        "(default: the tiny offline test model)")
    parser.add_argument("--dataset", help="dataset for datasets.load_dataset: a Hub name, a "
                        "local folder or a data file (default: generated Q&A data)")
    parser.add_argument("--dataset-split", default="train", help="split of --dataset to use")
    parser.add_argument("--output-dir", help="experiment folder (default: a new temp folder)")
    parser.add_argument("--num-chunks", type=int, default=4, help="chunks per epoch of each run")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs per run")
    parser.add_argument("--rows", type=int, default=160,
                        help=f"rows used in all; {EVAL_FRACTION * 100:.0f}%% are held out for eval")
    parser.add_argument("--batch-size", type=int, default=8, help="per-device batch size")
    parser.add_argument("--learning-rates", type=float, nargs="+", metavar="LR",
                        help="learning-rate knob values (default depends on the model)")
    parser.add_argument("--lora-ranks", type=int, nargs="+", metavar="R",
                        help="LoRA rank knob values (default depends on the model)")
    args = parser.parse_args(argv)
    if args.rows < 10:
        parser.error("--rows must be at least 10 (some rows are held out for evaluation)")
    return args


def _load_user_dataset(name: str, split: str, rows: int) -> Dataset:
    extension = os.path.splitext(name)[1].lower()
    if os.path.isfile(name) and extension in _DATA_FILE_BUILDERS:
        dataset = load_dataset(_DATA_FILE_BUILDERS[extension], data_files=name, split="train")
    else:
        dataset = load_dataset(name, split=split)
    # Keep only the columns SFTTrainer reads, so extra metadata columns cannot trip it up.
    for columns in (["messages"], ["prompt", "completion"], ["text"]):
        if all(c in dataset.column_names for c in columns):
            dataset = dataset.select_columns(columns)
            break
    else:
        raise SystemExit(f"{name}: expected a 'text', 'messages' or 'prompt'/'completion' "
                         f"column, found {dataset.column_names}")
    return dataset.shuffle(seed=0).select(range(min(rows, len(dataset))))


def _has_chat_template(model: str) -> bool:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).chat_template is not None


def build_data(args: argparse.Namespace, model: str) -> tuple[Dataset, Dataset]:
    """The train split and the held-out eval split."""
    if args.dataset:
        dataset = _load_user_dataset(args.dataset, args.dataset_split, args.rows)
    else:
        # Conversational rows (prompt/completion messages: loss on the answer only) need a chat
        # template; for a base model without one, use plain text rows.
        kind = "prompt_completion" if _has_chat_template(model) else "text"
        dataset = make_sft_dataset(args.rows, seed=0, kind=kind)
    split = dataset.train_test_split(test_size=EVAL_FRACTION, seed=0)
    return split["train"], split["test"]


def _lora_configs(args: argparse.Namespace, tiny: bool) -> list[LoraConfig]:
    ranks = args.lora_ranks or (TINY_LORA_RANKS if tiny else REAL_LORA_RANKS)
    if tiny:
        return [tiny_lora_config(r=r) for r in ranks]
    return [
        LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.05, task_type="CAUSAL_LM",
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        for r in ranks
    ]


def _device_kwargs(tiny: bool) -> dict[str, Any]:
    """What differs between the tiny CPU model and a real model (on a GPU, ideally)."""
    if tiny:
        return cpu_training_kwargs()  # fp32, no checkpointing, no pinning, no extra saves
    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    kwargs: dict[str, Any] = {
        "bf16": bf16,
        "model_init_kwargs": {"dtype": "bfloat16" if bf16 else "float32"},
        "max_length": 512,  # short rows keep a small comparison fast
        "dataloader_pin_memory": cuda,
        "report_to": "none",
        "save_strategy": "no",  # each run's final adapter is saved all the same
    }
    if "activation_checkpointing" in {f.name for f in dataclasses.fields(TrainingArguments)}:
        # TRL's default (on), under transformers 5's name: the old name warns on every config.
        kwargs["activation_checkpointing"] = True
    return kwargs


def build_config(args: argparse.Namespace, output_dir: str, tiny: bool) -> RFSFTConfig:
    """The config group: every ``List`` is a knob, and the grid of knobs is the set of runs."""
    return RFSFTConfig(
        output_dir=output_dir,
        learning_rate=List(args.learning_rates
                           or (TINY_LEARNING_RATES if tiny else REAL_LEARNING_RATES)),
        lr_scheduler_type="cosine",
        warmup_steps=0.1,  # below 1: a ratio of the total steps
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        logging_steps=2,
        num_chunks=args.num_chunks,
        eval_strategy="chunk",  # evaluate every run at every chunk end
        seed=0,
        **{**_device_kwargs(tiny), "disable_tqdm": False},  # show the experiment's progress
    )


# ------------------------------------------------------------------------------- reporting


def _fmt(value: Any) -> str:
    if isinstance(value, LoraConfig):
        targets = ",".join(sorted(value.target_modules or []))
        return f"LoRA(r={value.r}, alpha={value.lora_alpha}, {targets})"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


METRIC_COLUMNS = {"last loss": "loss", "train_loss": "train_loss", "eval_loss": "eval_loss"}


def results_table(rf: Any) -> str:
    best = rf.best_run
    return table_of_runs(rf.runs, METRIC_COLUMNS, best=best.name if best else None)


def timeline(rf: Any) -> str:
    return chunk_timeline(rf.runs, rf.schedule)


def report(rf: Any, seconds: float) -> None:
    print(f"\n=== {len(rf.runs)} runs, {len(rf.schedule)} chunks, {seconds:.1f} s ===\n")
    print(results_table(rf))
    best = rf.best_run
    if best is not None:
        knobs = ", ".join(f"{k}={_fmt(v)}" for k, v in best.knobs.items())
        print(f"\nBest run (* above, lowest eval_loss): {best.name}  "
              f"eval_loss={_fmt(best.metrics.get('eval_loss'))}  {knobs}")
    print("\nFinal adapters:")
    for run in rf.runs:
        present = os.path.exists(os.path.join(run.final_dir, "adapter_model.safetensors"))
        print(f"  {run.name}: {run.final_dir}{'' if present else '  (missing)'}")
    print("\nChunk timeline (one column per chunk trained, in order; digit = the run's chunk):")
    print(timeline(rf))


def main(argv: Sequence[str] | None = None) -> Any:
    """Run the comparison and print its report; returns the ``RFSFTTrainer``."""
    args = parse_args(argv)
    tiny = args.model is None
    model = tiny_model_path() if tiny else args.model
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-sft-example-")
    train_ds, eval_ds = build_data(args, model)
    config = build_config(args, output_dir, tiny)

    from trl_rapidfire import RFSFTTrainer  # imports TRL's trainer stack: a few seconds

    rf = RFSFTTrainer(
        model=model,
        args=config,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        peft_config=List(_lora_configs(args, tiny)),
    )
    print(f"{len(rf.runs)} runs, {len(train_ds)} train / {len(eval_ds)} eval rows, "
          f"output in {output_dir}")
    started = time.perf_counter()
    rf.train()
    report(rf, time.perf_counter() - started)
    return rf


if __name__ == "__main__":
    main()
