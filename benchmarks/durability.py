"""Durability benchmark: what writing every run's checkpoint at every chunk boundary costs.

Workload (pinned): the overhead benchmark's (8 LoRA configs on the tiny offline Llama, 256
rows, batch 8, 1 epoch, ``num_chunks=4``), trained by one ``RFSFTTrainer`` per repetition.
Side A: as shipped (``engine.durable = True``: an atomic HF checkpoint per run per boundary).
Side B: the same with ``engine.durable = False``. Both in this process, alternating A B A B,
after an untimed warm-up; each side's best ``train()`` time is kept.

Printed: the best times, A/B, and the cost per checkpoint ((A - B) / checkpoints written).
The final adapters of A and B are compared bitwise (exit status 1 if any differs: the
checkpoints must not change training).

    python benchmarks/durability.py              # 3 pairs
    python benchmarks/durability.py --quick      # 64 rows, 1 pair, no warm-up
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time


def _train(output_dir: str, rows: int, durable: bool) -> tuple[float, int]:
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    with contextlib.redirect_stdout(io.StringIO()):
        trainer = RFSFTTrainer(
            model=tiny_model_path(),
            # Every boundary written: what is measured is a checkpoint's cost.
            args=RFSFTConfig(output_dir=output_dir, num_chunks=4, checkpoint_every="chunk",
                             learning_rate=List([1e-4, 3e-4, 1e-3, 3e-3]),
                             per_device_train_batch_size=8, num_train_epochs=1,
                             **cpu_training_kwargs()),
            train_dataset=make_sft_dataset(rows),
            peft_config=List([tiny_lora_config(r=r, target_modules=("q_proj", "v_proj"))
                              for r in (4, 8)]),
        )
        trainer.engine.durable = durable
        t0 = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - t0
    # A checkpoint at every boundary but a run's last (its end writes the final folder).
    checkpoints = sum(1 for c in trainer.schedule) - len(trainer.runs)
    return elapsed, checkpoints


def _same(a: str, b: str) -> bool:
    import torch
    from safetensors.torch import load_file

    for run in sorted(os.listdir(os.path.join(a, "runs"))):
        path = os.path.join("runs", run, "final", "adapter_model.safetensors")
        wa, wb = load_file(os.path.join(a, path)), load_file(os.path.join(b, path))
        if wa.keys() != wb.keys() or any(not torch.equal(wa[k], wb[k]) for k in wa):
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats = 64, 1
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"durability benchmark: 8 configs x 4 chunks, {args.rows} rows, "
          f"{torch.get_num_threads()} threads")
    best = {True: float("inf"), False: float("inf")}
    with tempfile.TemporaryDirectory(prefix="rf-durable-") as tmp:
        if not args.quick:  # a smoke test times nothing worth a warm-up
            _train(os.path.join(tmp, "warm"), 64, True)
        checkpoints = 0
        for rep in range(args.repeats):
            for durable in (True, False):
                out = os.path.join(tmp, f"{'A' if durable else 'B'}-{rep}")
                seconds, n = _train(out, args.rows, durable)
                checkpoints = n if durable else checkpoints
                best[durable] = min(best[durable], seconds)
                print(f"rep {rep} {'A durable' if durable else 'B no checkpoints'}: "
                      f"train {seconds:6.2f} s")
        same = _same(os.path.join(tmp, "A-0"), os.path.join(tmp, "B-0"))
    a, b = best[True], best[False]
    print(f"A / B = {a / b:.3f}   ({a:.2f} s / {b:.2f} s)")
    print(f"cost per checkpoint = {1000 * (a - b) / max(checkpoints, 1):.1f} ms "
          f"({checkpoints} checkpoints)")
    print(f"final adapters bitwise equal: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
