"""Compare several DPO configs at once: 2 betas x 2 loss types, LoRA, trained chunk by chunk.

Offline, on a CPU (the default: a tiny 2-layer Llama built locally and generated preference
data, where ``chosen`` is the right answer to a short arithmetic or copy question and
``rejected`` a wrong one; about 15 s on 2 otherwise idle CPU cores)::

    HF_HUB_OFFLINE=1 python examples/dpo_multi_config.py

On a GPU, with a real model (a Hub name or a local path) and a small real preference dataset (a
Hub name, a local dataset folder, or a .json/.jsonl/.csv/.parquet file with ``chosen`` and
``rejected`` columns and, optionally, ``prompt``; without ``--dataset`` the generated data is
used)::

    python examples/dpo_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset trl-lib/ultrafeedback_binarized --rows 1000 --output-dir ./rapidfire-dpo-example

The 4 runs share one base model, and the reference model too: with a LoRA ``peft_config`` and
no ``ref_model``, DPO's reference log-probabilities are those of the shared base model with the
adapters disabled, exactly as a plain ``DPOTrainer`` given ``peft_config`` computes them. No run
holds a copy of the model, as policy or as reference: 4 runs cost one base model plus 4 small
adapters.

The runs take turns: each epoch of each run is cut into ``--num-chunks`` chunks, every run
trains its first chunk before any run trains its second, and every run is evaluated on a
held-out split at each chunk end (``eval_strategy="chunk"``). Each run still ends exactly as it
would have trained alone with TRL's ``DPOTrainer``. DPO's loss is not comparable across loss
types (sigmoid, IPO and hinge losses have different scales), nor its reward margins across
betas (the implicit reward is ``beta`` times a log-ratio), so the best run is the one whose
implicit reward ranks ``chosen`` above ``rejected`` most often on the held-out split
(``metric_for_best_model="eval_rewards/accuracies"``; ties go to the first run declared). At the
end the script prints a table of the runs with DPO's reward metrics, the best run, where each
run's adapter was saved, and the order in which the chunks were trained. The tiny model is
randomly initialised: on it the comparison shows the mechanics, not which config is better (its
eval accuracies stay near chance).
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

from trl_rapidfire import List, RFDPOConfig
from trl_rapidfire.reports.report import chunk_timeline
from trl_rapidfire.reports.report import results_table as table_of_runs
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_dpo_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BETAS = [0.1, 0.5]
LOSS_TYPES = ["sigmoid", "ipo"]
# The tiny model starts from random weights and needs a large learning rate to move within a
# few dozen steps; a pretrained model needs the usual DPO + LoRA range.
TINY_LEARNING_RATE = 2e-2
REAL_LEARNING_RATE = 5e-5  # LoRA DPO; full fine-tuning would use ~10x less
TINY_LORA_RANK = 8
REAL_LORA_RANK = 16
EVAL_FRACTION = 0.2
BEST_METRIC = "eval_rewards/accuracies"
_DATA_FILE_BUILDERS = {
    ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet",
}  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Offline by default; see the module docstring for a GPU run.",
    )
    parser.add_argument("--model", help="Hub name or local path of a causal LM "
                        "(default: the tiny offline test model)")
    parser.add_argument("--dataset", help="preference dataset for datasets.load_dataset: a Hub "
                        "name, a local folder or a data file (default: generated data)")
    parser.add_argument("--dataset-split", default="train", help="split of --dataset to use")
    parser.add_argument("--output-dir", help="experiment folder (default: a new temp folder)")
    parser.add_argument("--num-chunks", type=int, default=3, help="chunks per epoch of each run")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs per run")
    parser.add_argument("--rows", type=int, default=160,
                        help=f"rows used in all; {EVAL_FRACTION * 100:.0f}%% are held out for eval")
    parser.add_argument("--batch-size", type=int, default=4, help="per-device batch size")
    parser.add_argument("--learning-rate", type=float,
                        help="learning rate of every run (default depends on the model)")
    parser.add_argument("--betas", type=float, nargs="+", default=BETAS, metavar="BETA",
                        help="beta knob values (strength of the pull towards the reference)")
    parser.add_argument("--loss-types", nargs="+", default=LOSS_TYPES, metavar="LOSS",
                        help="loss_type knob values (e.g. sigmoid, ipo, hinge, robust)")
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
    # Keep only the columns DPOTrainer reads (the prompt may be implicit in chosen/rejected).
    for columns in (["prompt", "chosen", "rejected"], ["chosen", "rejected"]):
        if all(c in dataset.column_names for c in columns):
            dataset = dataset.select_columns(columns)
            break
    else:
        raise SystemExit(f"{name}: expected 'chosen' and 'rejected' columns (and optionally "
                         f"'prompt'), found {dataset.column_names}")
    return dataset.shuffle(seed=0).select(range(min(rows, len(dataset))))


def _has_chat_template(model: str) -> bool:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).chat_template is not None


def build_data(args: argparse.Namespace, model: str) -> tuple[Dataset, Dataset]:
    """The train split and the held-out eval split."""
    if args.dataset:
        dataset = _load_user_dataset(args.dataset, args.dataset_split, args.rows)
    else:
        # Conversational rows (one user message, one assistant answer each) need a chat
        # template; for a base model without one, use plain text rows.
        dataset = make_dpo_dataset(args.rows, seed=0, conversational=_has_chat_template(model))
    split = dataset.train_test_split(test_size=EVAL_FRACTION, seed=0)
    return split["train"], split["test"]


def lora_config(tiny: bool) -> LoraConfig:
    """One adapter recipe for every run (the knobs here are DPO's own)."""
    if tiny:
        return tiny_lora_config(r=TINY_LORA_RANK)
    return LoraConfig(r=REAL_LORA_RANK, lora_alpha=2 * REAL_LORA_RANK, lora_dropout=0.05,
                      task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


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


def build_config(args: argparse.Namespace, output_dir: str, tiny: bool) -> RFDPOConfig:
    """The config group: every ``List`` is a knob, and the grid of knobs is the set of runs."""
    return RFDPOConfig(
        output_dir=output_dir,
        beta=List(args.betas),
        loss_type=List(args.loss_types),
        learning_rate=args.learning_rate or (TINY_LEARNING_RATE if tiny else REAL_LEARNING_RATE),
        lr_scheduler_type="cosine",
        warmup_steps=0.1,  # below 1: a ratio of the total steps
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        logging_steps=2,
        num_chunks=args.num_chunks,
        eval_strategy="chunk",  # evaluate every run at every chunk end
        metric_for_best_model=BEST_METRIC,  # comparable across betas and loss types
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
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return _fmt(value[0])  # TRL stores loss_type as a list of (combined) losses
    return "-" if value is None else str(value)


METRIC_COLUMNS = {  # header: logged key (the last value each run logged)
    "train_loss": "train_loss",
    "eval_loss": "eval_loss",
    "eval acc": "eval_rewards/accuracies",
    "eval margin": "eval_rewards/margins",
    "train acc": "rewards/accuracies",
    "train margin": "rewards/margins",
}


def results_table(rf: Any) -> str:
    best = rf.best_run
    return table_of_runs(rf.runs, METRIC_COLUMNS, best=best.name if best else None)


def timeline(rf: Any) -> str:
    return chunk_timeline(rf.runs, rf.schedule)


def report(rf: Any, seconds: float) -> None:
    print(f"\n=== {len(rf.runs)} runs, {len(rf.schedule)} chunks, {seconds:.1f} s ===\n")
    print(results_table(rf))
    print("\nacc: how often the implicit reward ranks chosen above rejected; margin: chosen "
          "minus rejected implicit reward (beta x log-ratio to the reference, so it scales "
          "with beta). Losses differ in scale across loss types.")
    best = rf.best_run
    if best is not None:
        knobs = ", ".join(f"{k}={_fmt(v)}" for k, v in best.knobs.items())
        print(f"\nBest run (* above, highest {BEST_METRIC}): {best.name}  "
              f"{BEST_METRIC}={_fmt(best.metrics.get(BEST_METRIC))}  {knobs}")
        value = best.metrics.get(BEST_METRIC)
        tied = [r.name for r in rf.runs
                if r.status == best.status and r.metrics.get(BEST_METRIC) == value]
        if len(tied) > 1:
            print(f"  (a tie between {', '.join(tied)}: the first one declared is picked)")
    print("\nFinal adapters (the reference model is the base model, adapters disabled):")
    for run in rf.runs:
        present = os.path.exists(os.path.join(run.final_dir, "adapter_model.safetensors"))
        print(f"  {run.name}: {run.final_dir}{'' if present else '  (missing)'}")
    print("\nChunk timeline (one column per chunk trained, in order; digit = the run's chunk):")
    print(timeline(rf))


def main(argv: Sequence[str] | None = None) -> Any:
    """Run the comparison and print its report; returns the ``RFDPOTrainer``."""
    args = parse_args(argv)
    tiny = args.model is None
    model = tiny_model_path() if tiny else args.model
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-dpo-example-")
    train_ds, eval_ds = build_data(args, model)
    config = build_config(args, output_dir, tiny)

    from trl_rapidfire import RFDPOTrainer  # imports TRL's trainer stack: a few seconds

    rf = RFDPOTrainer(
        model=model,
        args=config,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        peft_config=lora_config(tiny),  # no ref_model: the reference is the base model
    )
    print(f"{len(rf.runs)} runs, {len(train_ds)} train / {len(eval_ds)} eval rows, "
          f"output in {output_dir}")
    started = time.perf_counter()
    rf.train()
    report(rf, time.perf_counter() - started)
    return rf


if __name__ == "__main__":
    main()
