"""Time inside training steps, trl-rapidfire against plain TRL, for each trainer kind.

What swapping costs where it matters most: inside the steps themselves (forward, backward,
optimizer step, and for RLOO and Distillation the generation inside the loop). For each kind of
``--kinds`` (default the four added beside SFT/DPO/GRPO: KTO, Reward, RLOO, Distillation; any
of the seven), ``--configs`` learning rates (log-spaced 1e-4 .. 1e-2) on the tiny offline Llama
with LoRA r=8 on q_proj and v_proj (Reward: ``task_type="SEQ_CLS"``, its score head trained
per run), ``--rows`` rows, batch 4:

* **A, plain TRL**: each config trained alone by its TRL trainer, one after another;
* **B, trl-rapidfire**: one RF trainer over the same configs (``learning_rate=List([...])``),
  ``--chunks`` chunks a run, every run interleaved on one shared base model.

Timed: the seconds inside the steps of every run, summed: from ``on_step_begin`` to
``on_step_end`` of each optimizer step, read by a clock whose ``on_step_begin`` runs after
every other callback's (the engine's ends a run's turn there: the wait for the next turn is
not a step) and whose ``on_step_end`` runs before every other callback's. Each side's best of
``--repeats`` alternated pairs (A B A B, one process, after an untimed warm-up of both), with
the wall time of ``train()`` beside it. Printed per kind: both sides' seconds in steps, the
ratio B / A (target: at most 1.05), and the wall ratio. The final adapters are compared tensor
for tensor: the script exits 1 if a run differs from its plain TRL twin, never because of a
time.

Usage::

    python benchmarks/kinds_steps.py                  # KTO Reward RLOO Distillation, 3 pairs
    python benchmarks/kinds_steps.py --quick          # 1 pair, fewer rows: a smoke test
    python benchmarks/kinds_steps.py --kinds reward --configs 8 --repeats 5 --json out.json

Runs offline on CPU, one torch thread (``--threads``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared modules
from step_clock import StepClock  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

KINDS = ("sft", "dpo", "grpo", "kto", "reward", "rloo", "distillation")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def workload(kind: str, rows: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trainer's arguments (besides model and args) and the config's shared values."""
    from peft import LoraConfig

    from trl_rapidfire import testing as t

    lora = t.tiny_lora_config(r=8)
    config: dict[str, Any] = dict(t.cpu_training_kwargs(), per_device_train_batch_size=4,
                                  num_train_epochs=1, logging_steps=4, warmup_steps=0.1)
    if kind == "sft":
        return dict(train_dataset=t.make_sft_dataset(rows), peft_config=lora), config
    if kind == "dpo":
        return dict(train_dataset=t.make_dpo_dataset(rows), peft_config=lora), config
    if kind == "kto":
        return (dict(train_dataset=t.make_kto_dataset(rows), peft_config=lora),
                dict(config, max_length=32))
    if kind == "reward":
        seq = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                         task_type="SEQ_CLS")
        return dict(train_dataset=t.make_reward_dataset(rows), peft_config=seq), config
    if kind in ("grpo", "rloo"):
        rewards = [t.reward_correct_answer, t.reward_short]
        extra: dict[str, Any] = (dict(num_generations=2, generation_batch_size=4)
                                 if kind == "rloo" else dict(num_generations=4))
        extra["max_completion_length"] = 8
        return (dict(reward_funcs=rewards, train_dataset=t.make_grpo_dataset(rows),
                     peft_config=lora), dict(config, **extra))
    if kind == "distillation":
        return (dict(teacher_model=t.tiny_teacher_path(), peft_config=lora,
                     train_dataset=t.make_sft_dataset(rows, kind="prompt_completion")),
                dict(config, max_completion_length=8))
    raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")


def classes(kind: str) -> tuple[type, type, type, type]:
    """(plain trainer, plain config, RF trainer, RF config) of ``kind``."""
    import trl

    import trl_rapidfire as rf

    name = {"sft": "SFT", "dpo": "DPO", "grpo": "GRPO", "kto": "KTO", "reward": "Reward",
            "rloo": "RLOO", "distillation": "Distillation"}[kind]
    return (getattr(trl, f"{name}Trainer"), getattr(trl, f"{name}Config"),
            getattr(rf, f"RF{name}Trainer"), getattr(rf, f"RF{name}Config"))


@dataclass
class Side:
    in_steps: float
    steps: int
    wall: float
    folders: list[Path] = field(default_factory=list)


def plain_side(kind: str, rates: list[float], rows: int, out: Path) -> Side:
    from trl_rapidfire.testing import tiny_model_path

    trainer_cls, config_cls, _, _ = classes(kind)
    arguments, config = workload(kind, rows)
    total, steps, wall, folders = 0.0, 0, 0.0, []
    for i, lr in enumerate(rates):
        folder = out / f"plain-{i}"
        with quiet():
            trainer = trainer_cls(model=tiny_model_path(), **arguments,
                                  args=config_cls(output_dir=str(folder), learning_rate=lr,
                                                  **config))
        clock = StepClock(trainer)
        began = time.perf_counter()
        with quiet():
            trainer.train()
            trainer.save_model()
        wall += time.perf_counter() - began
        total, steps = total + clock.seconds, steps + clock.steps
        folders.append(folder)
    return Side(total, steps, wall, folders)


def rf_side(kind: str, rates: list[float], rows: int, chunks: int, out: Path) -> Side:
    from trl_rapidfire import List
    from trl_rapidfire.testing import tiny_model_path

    _, _, trainer_cls, config_cls = classes(kind)
    arguments, config = workload(kind, rows)
    with quiet():
        trainer = trainer_cls(model=tiny_model_path(), **arguments,
                              args=config_cls(output_dir=str(out / "rf"), num_chunks=chunks,
                                              learning_rate=List(rates), **config))
        clocks = [StepClock(trainer.run_trainer(f"run-{i}")) for i in range(len(rates))]
    began = time.perf_counter()
    with quiet():
        trainer.train()
    wall = time.perf_counter() - began
    return Side(sum(c.seconds for c in clocks), sum(c.steps for c in clocks), wall,
                [out / "rf" / "runs" / f"run-{i}" / "final" for i in range(len(rates))])


def same_weights(plain: list[Path], ours: list[Path]) -> bool:
    import torch
    from safetensors.torch import load_file

    for a, b in zip(plain, ours):
        x = load_file(a / "adapter_model.safetensors")
        y = load_file(b / "adapter_model.safetensors")
        if x.keys() != y.keys() or not all(torch.equal(x[k], y[k]) for k in x):
            return False
    return True


def measure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    rates = [10 ** (-4 + 2 * i / max(1, args.configs - 1)) for i in range(args.configs)]
    plain: list[Side] = []
    ours: list[Side] = []
    exact = True
    for repetition in range(args.repeats + 1):  # the first pair warms up, untimed
        with tempfile.TemporaryDirectory() as tmp:
            a = plain_side(kind, rates, args.rows, Path(tmp))
            b = rf_side(kind, rates, args.rows, args.chunks, Path(tmp))
            exact = exact and same_weights(a.folders, b.folders)
            if repetition:
                plain.append(a)
                ours.append(b)
    best_a = min(plain, key=lambda s: s.in_steps)
    best_b = min(ours, key=lambda s: s.in_steps)
    assert best_a.steps == best_b.steps, (kind, best_a.steps, best_b.steps)
    return {
        "kind": kind, "configs": args.configs, "rows": args.rows, "chunks": args.chunks,
        "steps": best_a.steps, "plain_in_steps": best_a.in_steps, "rf_in_steps": best_b.in_steps,
        "ratio_in_steps": best_b.in_steps / best_a.in_steps,
        "plain_wall": min(s.wall for s in plain), "rf_wall": min(s.wall for s in ours),
        "ratio_wall": min(s.wall for s in ours) / min(s.wall for s in plain),
        "all_in_steps": {"plain": [s.in_steps for s in plain], "rf": [s.in_steps for s in ours]},
        "bitwise": exact,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", default=["kto", "reward", "rloo", "distillation"],
                        choices=KINDS)
    parser.add_argument("--configs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="1 pair, 16 rows, 2 configs")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.rows, args.configs = 1, 16, 2
    import torch

    torch.set_num_threads(args.threads)
    results = []
    print(f"time inside steps, RF / plain TRL: {args.configs} configs, {args.rows} rows, "
          f"{args.chunks} chunks, best of {args.repeats} alternated pairs, "
          f"{args.threads} thread(s)")
    print(f"{'kind':<13}{'steps':>6}{'plain s':>9}{'RF s':>9}{'in steps':>10}{'wall':>7}  bitwise")
    for kind in args.kinds:
        r = measure(kind, args)
        results.append(r)
        print(f"{kind:<13}{r['steps']:>6}{r['plain_in_steps']:>9.3f}{r['rf_in_steps']:>9.3f}"
              f"{r['ratio_in_steps']:>10.3f}{r['ratio_wall']:>7.3f}  "
              f"{'yes' if r['bitwise'] else 'NO'}")
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(r["bitwise"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
