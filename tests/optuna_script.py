"""An OptunaSearch experiment script, for the tests that kill or launch it.

    python tests/optuna_script.py OUTPUT_DIR
    accelerate launch --multi_gpu --num_processes 2 ... tests/optuna_script.py OUTPUT_DIR

A seeded TPE search over ``learning_rate=Range(1e-5, 1e-1, log=True)`` x
``lr_scheduler_type=List([...])``: 6 runs, 2 at a time, 3 chunks each, evaluated at every
chunk end, on the tiny offline model. ``RF_TEST_KILL=<run>:<step>`` kills the whole
experiment when that run begins that optimizer step (see experiment_script.py);
``RF_TEST_ROWS`` sets the dataset size; ``RF_TEST_CHECKPOINT_EVERY`` sets ``checkpoint_every``.
"""

from __future__ import annotations

import os
import sys

import torch
from experiment_script import KillAt

from trl_rapidfire import List, Range, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.integrations.optuna.search import OptunaSearch
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


def main(output_dir: str) -> None:
    torch.set_num_threads(1)
    rows = int(os.environ.get("RF_TEST_ROWS", "24"))
    kwargs = dict(cpu_training_kwargs(), use_cpu=True, ddp_backend="gloo", report_to="none")
    if os.environ.get("RF_TEST_CHECKPOINT_EVERY"):
        kwargs["checkpoint_every"] = os.environ["RF_TEST_CHECKPOINT_EVERY"]
    callbacks = []
    kill = os.environ.get("RF_TEST_KILL")
    if kill:
        run, step = kill.split(":")
        callbacks.append(KillAt(run, int(step), False, output_dir))
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=output_dir, learning_rate=Range(1e-5, 1e-1, log=True),
                         lr_scheduler_type=List(["linear", "cosine", "constant"]),
                         num_chunks=3, num_train_epochs=1, per_device_train_batch_size=4,
                         eval_strategy="chunk", per_device_eval_batch_size=8, logging_steps=1,
                         seed=5, **kwargs),
        train_dataset=make_sft_dataset(rows, seed=1),
        eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4),
        search=OptunaSearch(num_runs=6, max_concurrent=2, seed=3),
        callbacks=callbacks,
    )
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1])
