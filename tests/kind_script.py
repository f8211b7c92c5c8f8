"""An experiment script of one of the trainer kinds in ``trainer_kinds.py`` (KTO, Reward, RLOO,
Distillation), as a user writes it, for the tests that kill, re-run and launch it:

    python tests/kind_script.py KIND OUTPUT_DIR
    accelerate launch --multi_gpu --num_processes 2 ... tests/kind_script.py KIND OUTPUT_DIR

Two learning rates x 3 chunks, every boundary durable (``checkpoint_every="chunk"``), one
thread. ``RF_TEST_KILL=<run>:<step>[:durable]`` kills the experiment's process group when
that run begins that step (see ``experiment_script.KillAt``).
"""

from __future__ import annotations

import os
import sys

import torch
from experiment_script import KillAt
from trainer_kinds import KINDS

from trl_rapidfire import List


def main(kind: str, output_dir: str) -> None:
    torch.set_num_threads(1)
    callbacks = []
    kill = os.environ.get("RF_TEST_KILL")
    if kill:
        run, step, *wait = kill.split(":")
        callbacks.append(KillAt(run, int(step), "".join(wait), output_dir))
    trainer = KINDS[kind].experiment(
        output_dir, trainer={"callbacks": callbacks}, num_chunks=3,
        learning_rate=List([1e-3, 3e-3]), checkpoint_every="chunk", use_cpu=True,
        ddp_backend="gloo")
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
