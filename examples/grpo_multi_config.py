"""Compare several GRPO configs at once: 2 learning rates x 2 reward sets, trained chunk by chunk.

The reward sets are zipped with their weights (not crossed): a verifiable reward that checks the
completion's final answer against the dataset's ``answer`` column plus a format reward for a
bare answer (weights 1.0 and 0.5), against the verifiable reward alone (weight 1.0).

Offline, on a CPU (the default: a tiny 2-layer Llama built locally and generated arithmetic,
counting and copy questions with their answers; about 15 s on 2 otherwise idle CPU cores)::

    HF_HUB_OFFLINE=1 python examples/grpo_multi_config.py

On a GPU, with a real model (a Hub name or a local path) and a small real dataset with a
verifiable answer (a Hub name, a local dataset folder, or a .json/.jsonl/.csv/.parquet file with
``prompt`` or ``question`` and ``answer`` columns; a GSM8K-style ``... #### 42`` answer is cut
to its final number; without ``--dataset`` the generated data is used)::

    python examples/grpo_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset openai/gsm8k --dataset-config main --rows 500 \\
        --max-completion-length 256 --output-dir ./rapidfire-grpo-example

The runs take turns chunk by chunk, and every run ends exactly as it would have trained alone
with TRL's ``GRPOTrainer``. GRPO adds one constraint: completions are generated once per
*generation cycle* of ``steps_per_generation x num_iterations`` micro-steps and then consumed
slice by slice, so a chunk boundary inside a cycle would park a run with half-used completions
in its buffer. Chunk boundaries are therefore rounded to whole generation cycles (and whole
gradient-accumulation groups): with ``steps_per_generation=2`` every chunk starts and ends on an
even optimizer step, except the last chunk of an epoch, which ends on the epoch's last step.
The ``--num-chunks`` spans are near-equal in whole cycles, so chunks may differ by one cycle
(the default 32 steps per run in 3 chunks are cut at steps 12, 22 and 32, where whole steps
would give 11, 22 and 32), and ``num_chunks`` is lowered (with a warning) when an epoch has
fewer cycles than that.

Every run is evaluated on a held-out split at each chunk end (``eval_strategy="chunk"``; GRPO
evaluates by generating completions for the held-out prompts and scoring them). The best run is
the one with the highest mean *verifiable* reward on that split: the total reward is not
comparable across reward sets (one set adds a weighted format reward). At the end the script
prints a table of the runs with their reward metrics, the best run, where each run's adapter was
saved, and the order in which the chunks were trained. The tiny model is randomly initialised
and writes byte-level noise: on it the comparison shows the mechanics, not which config is better
(its verifiable reward stays near 0, so the best run is often a tie, which goes to the first run
declared).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch
from datasets import Dataset, load_dataset
from peft import LoraConfig
from transformers import TrainingArguments

from trl_rapidfire import GridSearch, List, RFGRPOConfig
from trl_rapidfire.reports.report import chunk_timeline
from trl_rapidfire.reports.report import results_table as table_of_runs
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_grpo_dataset,
    tiny_lora_config,
    tiny_model_path,
)

# The tiny model starts from random weights and needs large learning rates to move within a
# few dozen steps; a pretrained model needs the usual GRPO + LoRA range.
TINY_LEARNING_RATES = [1e-2, 3e-3]
REAL_LEARNING_RATES = [2e-5, 5e-6]
FORMAT_WEIGHT = 0.5
EVAL_FRACTION = 0.2
INSTRUCTION = "Answer with the final answer only."  # appended to the prompts of --dataset
_DATA_FILE_BUILDERS = {
    ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet",
}  # fmt: skip


# --------------------------------------------------------------------------------- rewards
# TRL calls a reward function with the completions and every dataset column as keywords, and
# logs its mean as ``rewards/<function name>/mean``.

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BARE_ANSWER = re.compile(r"\s*(?:-?\d+(?:\.\d+)?|[A-Za-z]+)\s*[.!]?\s*")


def _text(completion: Any) -> str:
    """A completion as text: a string (plain prompts) or a list of messages (conversational)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)


def _final_answer(text: str, numeric: bool) -> str | None:
    """The last number (numeric answers) or the last word of a completion."""
    if numeric:
        numbers = _NUMBER.findall(text.replace(",", ""))
        return numbers[-1] if numbers else None
    words = re.findall(r"[A-Za-z]+", text)
    return words[-1].lower() if words else None


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def correct_answer(completions: Sequence[Any], answer: Sequence[str], **kwargs: Any) -> list[float]:
    """Verifiable reward: 1.0 when the completion's final answer is the ``answer`` column's value
    (the last number for a numeric answer, compared as a number; the last word otherwise,
    ignoring case), else 0.0."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        expected = str(expected).strip().replace(",", "")
        numeric = _NUMBER.fullmatch(expected) is not None
        got = _final_answer(_text(completion), numeric)
        if got is None:
            rewards.append(0.0)
        elif numeric:
            rewards.append(1.0 if _same_number(got, expected) else 0.0)
        else:
            rewards.append(1.0 if got == expected.lower() else 0.0)
    return rewards


def answer_format(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Format reward: 1.0 for a bare answer (a single number or word, nothing else); otherwise
    partial credit that shrinks with length, ``0.5 * (1 - chars / 64)`` clipped at 0, so that a
    model that never yet produces a bare answer still gets a signal towards shorter ones."""
    rewards = []
    for completion in completions:
        text = _text(completion)
        if _BARE_ANSWER.fullmatch(text):
            rewards.append(1.0)
        else:
            rewards.append(0.5 * max(0.0, 1.0 - len(text.strip()) / 64))
    return rewards


REWARD_SETS = [[correct_answer, answer_format], [correct_answer]]
REWARD_WEIGHTS = [[1.0, FORMAT_WEIGHT], [1.0]]
BEST_METRIC = f"eval_rewards/{correct_answer.__name__}/mean"


# ------------------------------------------------------------------------------ arguments


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Offline by default; see the module docstring for a GPU run.",
    )
    parser.add_argument("--model", help="Hub name or local path of a causal LM "
                        "(default: the tiny offline test model)")
    parser.add_argument("--dataset", help="dataset for datasets.load_dataset: a Hub name, a "
                        "local folder or a data file (default: generated questions)")
    parser.add_argument("--dataset-config", help="config name of --dataset (e.g. 'main')")
    parser.add_argument("--dataset-split", default="train", help="split of --dataset to use")
    parser.add_argument("--output-dir", help="experiment folder (default: a new temp folder)")
    parser.add_argument("--num-chunks", type=int, default=3, help="chunks per epoch of each run")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs per run")
    parser.add_argument("--rows", type=int, default=40,
                        help=f"prompts used in all; {EVAL_FRACTION * 100:.0f}%% are held out "
                        "for eval")
    parser.add_argument("--batch-size", type=int, default=4,
                        help="per-device batch size, in completions (a multiple of "
                        "--num-generations)")
    parser.add_argument("--num-generations", type=int, default=4,
                        help="completions sampled per prompt (the GRPO group)")
    parser.add_argument("--steps-per-generation", type=int, default=2,
                        help="optimizer steps that consume one generation batch")
    parser.add_argument("--max-completion-length", type=int,
                        help="tokens per completion (default: 8 for the tiny model, else 128)")
    parser.add_argument("--learning-rates", type=float, nargs="+", metavar="LR",
                        help="learning-rate knob values (default depends on the model)")
    args = parser.parse_args(argv)
    if args.rows < 10:
        parser.error("--rows must be at least 10 (some rows are held out for evaluation)")
    if args.batch_size % args.num_generations:
        parser.error("--batch-size must be a multiple of --num-generations")
    return args


# ----------------------------------------------------------------------------------- data


def _load_user_dataset(args: argparse.Namespace, chat: bool) -> Dataset:
    name = args.dataset
    extension = os.path.splitext(name)[1].lower()
    if os.path.isfile(name) and extension in _DATA_FILE_BUILDERS:
        dataset = load_dataset(_DATA_FILE_BUILDERS[extension], data_files=name, split="train")
    else:
        dataset = load_dataset(name, args.dataset_config, split=args.dataset_split)
    question = next((c for c in ("prompt", "question", "problem") if c in dataset.column_names),
                    None)
    if question is None or "answer" not in dataset.column_names:
        raise SystemExit(f"{name}: expected a 'prompt' or 'question' column and an 'answer' "
                         f"column, found {dataset.column_names}")
    dataset = dataset.shuffle(seed=0).select(range(min(args.rows, len(dataset))))

    def to_row(row: dict[str, Any]) -> dict[str, Any]:
        prompt = row[question]
        if isinstance(prompt, str):
            text = f"{prompt.strip()}\n{INSTRUCTION}"
            prompt = [{"role": "user", "content": text}] if chat else text
        # GSM8K-style answers end with "#### <final answer>": keep the final answer only.
        answer = str(row["answer"]).split("####")[-1].strip()
        return {"prompt": prompt, "answer": answer}

    return dataset.map(to_row, remove_columns=dataset.column_names)


def _has_chat_template(model: str) -> bool:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).chat_template is not None


def build_data(args: argparse.Namespace, model: str) -> tuple[Dataset, Dataset]:
    """The train split and the held-out eval split (``prompt`` and ``answer`` columns)."""
    chat = _has_chat_template(model)
    if args.dataset:
        dataset = _load_user_dataset(args, chat)
    else:
        dataset = make_grpo_dataset(args.rows, seed=0, conversational=chat)
    split = dataset.train_test_split(test_size=EVAL_FRACTION, seed=0)
    return split["train"], split["test"]


# --------------------------------------------------------------------------------- config


def lora_config(tiny: bool) -> LoraConfig:
    """One adapter recipe for every run (the knobs here are the learning rate and rewards)."""
    if tiny:
        return tiny_lora_config(r=8)
    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM",
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
        "dataloader_pin_memory": cuda,
        "report_to": "none",
        "save_strategy": "no",  # each run's final adapter is saved all the same
    }
    if "activation_checkpointing" in {f.name for f in dataclasses.fields(TrainingArguments)}:
        # TRL's default (on), under transformers 5's name: the old name warns on every config.
        kwargs["activation_checkpointing"] = True
    return kwargs


def build_config(args: argparse.Namespace, output_dir: str, tiny: bool) -> RFGRPOConfig:
    """The config group: every ``List`` is a knob. ``reward_weights`` is zipped with the
    trainer's ``reward_funcs`` knob (see :func:`main`), and crossed with the learning rates."""
    return RFGRPOConfig(
        output_dir=output_dir,
        learning_rate=List(args.learning_rates
                           or (TINY_LEARNING_RATES if tiny else REAL_LEARNING_RATES)),
        reward_weights=List(REWARD_WEIGHTS),
        lr_scheduler_type="constant",
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        num_generations=args.num_generations,
        steps_per_generation=args.steps_per_generation,
        max_completion_length=args.max_completion_length or (8 if tiny else 128),
        num_train_epochs=args.epochs,
        logging_steps=args.steps_per_generation,  # one log line per generation cycle
        num_chunks=args.num_chunks,
        eval_strategy="chunk",  # evaluate every run at every chunk end
        metric_for_best_model=BEST_METRIC,
        seed=0,
        **{**_device_kwargs(tiny), "disable_tqdm": False},  # show the experiment's progress
    )


# ------------------------------------------------------------------------------- reporting


def _fmt(value: Any) -> str:
    if isinstance(value, LoraConfig):
        targets = ",".join(sorted(value.target_modules or []))
        return f"LoRA(r={value.r}, alpha={value.lora_alpha}, {targets})"
    if callable(value):
        return getattr(value, "__name__", repr(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


_CORRECT = f"rewards/{correct_answer.__name__}/mean"
_FORMAT = f"rewards/{answer_format.__name__}/mean"
METRIC_COLUMNS = {  # header: logged key (the last value each run logged)
    "eval correct": f"eval_{_CORRECT}",
    "eval format": f"eval_{_FORMAT}",
    "eval reward": "eval_reward",
    "correct": _CORRECT,
    "format": _FORMAT,
    "reward": "reward",
    "len": "completions/mean_length",
}


def results_table(rf: Any) -> str:
    best = rf.best_run
    return table_of_runs(rf.runs, METRIC_COLUMNS, best=best.name if best else None)


def timeline(rf: Any) -> str:
    return chunk_timeline(rf.runs, rf.schedule, steps=True)


def report(rf: Any, seconds: float, cycle: int) -> None:
    print(f"\n=== {len(rf.runs)} runs, {len(rf.schedule)} chunks, {seconds:.1f} s ===\n")
    print(results_table(rf))
    print(f"\ncorrect / format: mean {correct_answer.__name__} / {answer_format.__name__} "
          "reward (unweighted; '-': not in the run's reward set); reward: the weighted sum "
          "the run optimises; len: mean completion tokens. Columns without 'eval' are the "
          "last training log.")
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
    print("\nFinal adapters:")
    for run in rf.runs:
        present = os.path.exists(os.path.join(run.final_dir, "adapter_model.safetensors"))
        print(f"  {run.name}: {run.final_dir}{'' if present else '  (missing)'}")
    print(f"\nChunk timeline (one column per chunk trained, in order; digit = the run's chunk; "
          f"chunk boundaries on multiples of the {cycle}-step generation cycle):")
    print(timeline(rf))


def main(argv: Sequence[str] | None = None) -> Any:
    """Run the comparison and print its report; returns the ``RFGRPOTrainer``."""
    args = parse_args(argv)
    tiny = args.model is None
    model = tiny_model_path() if tiny else args.model
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-grpo-example-")
    train_ds, eval_ds = build_data(args, model)
    config = build_config(args, output_dir, tiny)

    from trl_rapidfire import RFGRPOTrainer  # imports TRL's trainer stack: a few seconds
    from trl_rapidfire.trainers.grpo import generation_cycle_steps

    rf = RFGRPOTrainer(
        model=model,
        reward_funcs=List(REWARD_SETS),
        args=config,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        peft_config=lora_config(tiny),
        # Pair reward set i with weight list i (2 pairs), crossed with the learning rates.
        search=GridSearch(zip=[("reward_funcs", "reward_weights")]),
    )
    cycle = generation_cycle_steps(rf.run_trainer(rf.runs[0].name).args)
    print(f"{len(rf.runs)} runs, {len(train_ds)} train / {len(eval_ds)} eval prompts, "
          f"generation cycle {cycle} steps, output in {output_dir}")
    started = time.perf_counter()
    rf.train()
    report(rf, time.perf_counter() - started, cycle)
    return rf


if __name__ == "__main__":
    main()
