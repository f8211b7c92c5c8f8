"""Judge runs by what they answer: 4 SFT configs scored on their generated answers per chunk.

Offline, on a CPU (a tiny 2-layer Llama built locally and generated Q&A data, about 15 s on 2
CPU cores)::

    HF_HUB_OFFLINE=1 python examples/sft_generation_eval.py

At every chunk end each run answers the eval prompts with its own adapter (greedy, at most 4
new tokens), and ``score`` compares the decoded answers with the reference answers: exact
match, and ROUGE-L when ``rouge-score`` is installed (``pip install rouge-score``; it runs
offline). The scores are logged as ``eval_exact_match`` / ``eval_rouge_l`` beside the eval
loss: in the table below, in MLflow when tracking is on, for policies and searches. A few
answers of every evaluation are kept in ``<output_dir>/runs/<run>/generations/``; the best
run's last ones are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import EvalPrediction, GenerationConfig

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.reports.report import results_table
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

LEARNING_RATES = [1e-2, 3e-2]
RANKS = [4, 16]


def score(prediction: EvalPrediction) -> dict[str, float]:
    """Exact match (and ROUGE-L if rouge-score is installed) of the decoded answers."""
    answers, references = prediction
    pairs = [(a.strip(), r.strip()) for a, r in zip(answers, references)]
    scores = {"exact_match": sum(a == r for a, r in pairs) / len(pairs)}
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        return scores
    rouge = rouge_scorer.RougeScorer(["rougeL"])
    scores["rouge_l"] = sum(rouge.score(r, a)["rougeL"].fmeasure for a, r in pairs) / len(pairs)
    return scores


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", help="experiment folder (default: a new temp folder)")
    parser.add_argument("--rows", type=int, default=1024, help="training rows (one epoch)")
    parser.add_argument("--eval-rows", type=int, default=32, help="eval prompts")
    parser.add_argument("--num-chunks", type=int, default=4, help="chunks per run")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Any:
    """Run the experiment, print the runs with their scores; returns the trainer."""
    args = parse_args(argv)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-generation-")
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(
            output_dir=output_dir,
            learning_rate=List(LEARNING_RATES),
            per_device_train_batch_size=8,
            per_device_eval_batch_size=16,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",
            generation_config=GenerationConfig(max_new_tokens=4, do_sample=False),
            generation_saved_rows=4,
            metric_for_best_model="eval_exact_match",  # the best run answers best
            **cpu_training_kwargs(),
        ),
        train_dataset=make_sft_dataset(args.rows, seed=1, kind="prompt_completion"),
        eval_dataset=make_sft_dataset(args.eval_rows, seed=9, kind="prompt_completion"),
        peft_config=List([tiny_lora_config(r=r) for r in RANKS]),
        compute_metrics=score,
    )
    print(f"{len(trainer.runs)} runs, {args.num_chunks} chunks each, output in {output_dir}")
    started = time.perf_counter()
    trainer.train()
    print(f"trained in {time.perf_counter() - started:.1f} s")
    columns = {"eval_loss": "eval_loss", "exact": "eval_exact_match",
               "rouge_l": "eval_rouge_l", "gen s": "eval_generation_seconds"}
    best = trainer.best_run
    print(results_table(trainer.runs, columns, best=best.name if best else None))
    if best is not None:
        folder = Path(best.output_dir) / "generations"
        last = max(folder.glob("eval-step-*.jsonl"), key=lambda p: int(p.stem.split("-")[-1]))
        print(f"{best.name}'s answers at step {int(last.stem.split('-')[-1])}:")
        for line in last.read_text().splitlines():
            row = json.loads(line)
            print(f"  {row['prompt']!r} -> {row['answer']!r} (reference {row['reference']!r})")
    return trainer


if __name__ == "__main__":
    main()
