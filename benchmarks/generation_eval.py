"""What judging runs by their answers costs: chunk-end evaluation with and without generation.

Workload: 2 LoRA configs (learning rates 1e-3, 3e-3; rank 8, q/k/v/o) trained ``--steps``
steps each in ``--chunks`` chunks, batch 1, evaluated at every chunk end on ``--eval-rows``
prompt/completion rows (batch ``--eval-batch``). Side A evaluates the loss only; side B also
generates (greedy, ``--new-tokens`` new tokens, ``generation_config``) and scores the answers
(exact match). Both sides run in this process, A then B, on the same model and data.

Models: ``tiny`` (the test bed's 2-layer Llama), ``quick`` (2 layers, hidden 64, vocab 1,000)
or ``full`` (SmolLM2-135M's shape with random weights, from ``real_shape.py``); the real-shape
rows are pseudo-words: a 48-word prompt and an 8-word completion.

Printed, per side: wall time of ``train()``, and for B the mean generation time per
evaluation (``eval_generation_seconds``, logged by every evaluation) and its share of B's
wall; then ``wall generation / baseline`` (B over A); and ``bitwise equal for N/N runs``:
each run's final adapter with generation eval against the same run's without it (generating
must not change training). Exit status 1 if any differs. The generation cost grows with eval
rows x new tokens: a per-run cost paid at each chunk end.

Usage::

    python benchmarks/generation_eval.py --quick                    # the tiny model, seconds
    python benchmarks/generation_eval.py --model full --threads 1   # minutes on one core
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _data(model: str, rows: int, seed: int) -> Any:
    from datasets import Dataset

    if model == "tiny":
        from trl_rapidfire.testing import make_sft_dataset

        return make_sft_dataset(rows, seed=seed, kind="prompt_completion")
    from real_shape import _lines

    lines = _lines(rows, 56, seed=seed)
    return Dataset.from_dict({"prompt": [" ".join(x.split()[:48]) for x in lines],
                              "completion": [" " + " ".join(x.split()[48:]) for x in lines]})


def _model_path(model: str) -> str:
    if model == "tiny":
        from trl_rapidfire.testing import tiny_model_path

        return tiny_model_path()
    from real_shape import FULL, QUICK, model_path

    return model_path(FULL if model == "full" else QUICK)


def side(args: argparse.Namespace, generate: bool, out: Path) -> dict[str, Any]:
    from peft import LoraConfig
    from transformers import GenerationConfig

    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import cpu_training_kwargs

    extra: dict[str, Any] = {}
    if generate:
        extra = dict(generation_config=GenerationConfig(max_new_tokens=args.new_tokens,
                                                        do_sample=False),
                     generation_saved_rows=0)
    trainer = RFSFTTrainer(
        model=_model_path(args.model),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]),
                         num_chunks=args.chunks, eval_strategy="chunk",
                         per_device_train_batch_size=1,
                         per_device_eval_batch_size=args.eval_batch, num_train_epochs=1,
                         max_length=256, logging_steps=1, seed=0, **extra,
                         **cpu_training_kwargs()),
        train_dataset=_data(args.model, args.steps, seed=1),
        eval_dataset=_data(args.model, args.eval_rows, seed=2),
        peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                               target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    generation = [e["eval_generation_seconds"] for run in ("run-0", "run-1")
                  for e in trainer.run_trainer(run).state.log_history
                  if "eval_generation_seconds" in e]
    return {"wall": wall, "evals": len(generation), "out": str(out),
            "generation": statistics.mean(generation) if generation else 0.0,
            "generation_total": sum(generation)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "quick", "full"], default="tiny")
    parser.add_argument("--steps", type=int, default=16, help="training rows = steps per run")
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--eval-rows", type=int, default=16)
    parser.add_argument("--eval-batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, help="torch threads (1 on a busy machine)")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 8 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.steps, args.chunks, args.eval_rows = "tiny", 8, 2, 8
    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="rf-generation-bench-") as tmp:
        loss_only = side(args, False, Path(tmp) / "a")
        generating = side(args, True, Path(tmp) / "b")
        equal = [run for run in ("run-0", "run-1") if _same_adapter(
            Path(loss_only["out"]) / "runs" / run / "final",
            Path(generating["out"]) / "runs" / run / "final")]
    print(f"model {args.model}: 2 configs x {args.steps} steps in {args.chunks} chunks, "
          f"{args.eval_rows} eval rows, {args.new_tokens} new tokens, threads "
          f"{torch.get_num_threads()}")
    print(f"A loss-only eval     wall {loss_only['wall']:8.2f} s")
    print(f"B + generation eval  wall {generating['wall']:8.2f} s   "
          f"{generating['evals']} generation evals, {generating['generation']:.3f} s each "
          f"({generating['generation_total'] / generating['wall']:.0%} of B's wall)")
    print(f"wall generation / baseline = {generating['wall'] / loss_only['wall']:.2f}")
    print(f"bitwise equal for {len(equal)}/2 runs (final adapters with and without "
          "generation eval)")
    return 0 if len(equal) == 2 else 1


def _same_adapter(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    x = load_file(a / "adapter_model.safetensors")
    y = load_file(b / "adapter_model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


if __name__ == "__main__":
    raise SystemExit(main())
