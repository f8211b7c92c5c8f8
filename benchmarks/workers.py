"""Workers benchmark: one experiment trained by 1 worker, then by 2 under ``accelerate launch``.

Workload (pinned): 4 LoRA configs (learning rate 1e-3, 3e-3 x LR schedule linear, cosine) on
the tiny offline Llama, ``--rows`` rows (default 512), batch 4, 1 epoch, 3 chunks per run, one
thread per process (``OMP_NUM_THREADS=1``) so that the two sides do the same arithmetic.

Side A: ``python workers.py --experiment OUT`` (one worker). Side B: the same script under
``accelerate launch --multi_gpu --num_processes 2`` (on a CPU-only machine this is how two
processes start). Both run in fresh processes, alternating A B A B; the best of each is kept.

Printed per side: ``span`` = from the first chunk's start to the last chunk's end in
``schedule.csv`` (the training itself), and ``process`` = the whole command (imports, model
and dataset preparation, trainers: paid by each worker in parallel). Headline: B/A for both,
and whether every final adapter of B equals A's bitwise (exit status 1 if not).

    python benchmarks/workers.py                 # 2 pairs, 512 rows
    python benchmarks/workers.py --quick         # 96 rows, 1 pair
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def experiment(output_dir: str, rows: int) -> None:
    """The user's script: what each worker runs."""
    import torch

    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    torch.set_num_threads(1)
    config = RFSFTConfig(
        output_dir=output_dir, learning_rate=List([1e-3, 3e-3]),
        lr_scheduler_type=List(["linear", "cosine"]), per_device_train_batch_size=4,
        num_train_epochs=1, num_chunks=3, seed=7,
        **dict(cpu_training_kwargs(), use_cpu=True, ddp_backend="gloo"),
    )
    RFSFTTrainer(model=tiny_model_path(), args=config,
                 train_dataset=make_sft_dataset(rows, seed=3),
                 peft_config=tiny_lora_config(r=8)).train()


def _side(workers: int, out: Path, rows: int) -> tuple[float, float]:
    from trl_rapidfire.storage.schedule import read_schedule_csv

    cmd = [sys.executable, __file__, "--experiment", str(out), "--rows", str(rows)]
    if workers > 1:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
               "--num_processes", str(workers), "--num_machines", "1", "--mixed_precision",
               "no", "--dynamo_backend", "no", *cmd[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{workers} worker(s) failed:\n{proc.stderr[-4000:]}")
    rows_ = read_schedule_csv(out / "schedule.csv")
    span = max(r.end_time for r in rows_) - min(r.start_time for r in rows_)
    return span, wall


def _same_adapters(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    for run in sorted(p.name for p in (a / "runs").iterdir()):
        wa = load_file(a / "runs" / run / "final" / "adapter_model.safetensors")
        wb = load_file(b / "runs" / run / "final" / "adapter_model.safetensors")
        if wa.keys() != wb.keys() or any(not torch.equal(wa[k], wb[k]) for k in wa):
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.experiment:
        experiment(args.experiment, args.rows)
        return 0
    if args.quick:
        args.rows, args.repeats = 96, 1
    from trl_rapidfire.testing import tiny_model_path

    tiny_model_path()
    print(f"workers benchmark: 4 configs x 3 chunks, {args.rows} rows, 1 thread per process, "
          f"{os.cpu_count()} cores")
    best: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="rf-workers-") as tmp:
        for rep in range(args.repeats):
            for workers in (1, 2):
                out = Path(tmp) / f"w{workers}-{rep}"
                span, wall = _side(workers, out, args.rows)
                print(f"rep {rep} workers {workers}: span {span:7.2f} s   process {wall:7.2f} s")
                old = best.get(workers)
                best[workers] = (min(span, old[0]), min(wall, old[1])) if old else (span, wall)
        same = _same_adapters(Path(tmp) / "w1-0", Path(tmp) / "w2-0")
    (s1, w1), (s2, w2) = best[1], best[2]
    print(f"span    2 workers / 1 worker = {s2 / s1:.2f}  ({s2:.2f} s / {s1:.2f} s)")
    print(f"process 2 workers / 1 worker = {w2 / w1:.2f}  ({w2:.2f} s / {w1:.2f} s)")
    print(f"final adapters bitwise equal: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
