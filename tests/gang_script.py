"""An experiment with FSDP runs (trained by a gang of all workers) and single-device runs, for
the multi-process gang tests, and the plain-TRL references they are compared with.

    accelerate launch --multi_gpu --num_processes 2 ... tests/gang_script.py rf OUTPUT_DIR
    accelerate launch --multi_gpu --num_processes 2 ... tests/gang_script.py plain OUT LR FSDP

``rf``: one RFSFTTrainer, ``fsdp`` a knob (on, off) x 2 learning rates = 4 runs, 3 chunks.
``RF_TEST_KILL=<run>:<step>`` kills the whole launch (``kill -9`` of its process group) when
that run begins that step, mid-chunk. ``RF_TEST_STOP=<run>:<step>`` stops that run from the
script when it begins that step (the stop applies at its next chunk boundary), and resumes it
in a second ``train()``.

``plain``: one plain SFTTrainer with that learning rate, with or without fsdp (1 = on), the
same settings otherwise; under the launch when fsdp is on (the gang's reference), alone when
it is off. The final adapter goes to ``OUT/final``.
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import TrainerCallback

LEARNING_RATES = [1e-3, 3e-3]
FSDP = "full_shard auto_wrap"
FSDP_CONFIG = {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}


def _common() -> dict:
    from trl_rapidfire.testing import cpu_training_kwargs

    return dict(cpu_training_kwargs(), use_cpu=True, per_device_train_batch_size=4,
                num_train_epochs=1, logging_steps=1, seed=7, report_to="none",
                lr_scheduler_type="linear", warmup_steps=2)


class StopAt(TrainerCallback):
    """Asks the experiment to stop ``run`` when it begins ``step`` (from the script, as a
    person would: every worker asks, the first applies it at the run's next boundary)."""

    trainer = None

    def __init__(self, run: str, step: int) -> None:
        self.run, self.step, self.done = run, step, False

    def on_step_begin(self, args, state, control, **kwargs):
        if args.output_dir.endswith(self.run) and state.global_step == self.step \
                and not self.done:
            self.done = True
            StopAt.trainer.stop(self.run)


def rf(output_dir: str) -> None:
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import make_sft_dataset, tiny_lora_config, tiny_model_path

    config = RFSFTConfig(output_dir=output_dir, learning_rate=List(LEARNING_RATES),
                         fsdp=List([FSDP, ""]), fsdp_config=FSDP_CONFIG, num_chunks=3,
                         **_common())
    callbacks: list = []
    stop = os.environ.get("RF_TEST_STOP")
    if stop:
        stop_run, stop_step = stop.split(":")
        callbacks.append(StopAt(stop_run, int(stop_step)))
    if os.environ.get("RF_TEST_KILL"):
        from experiment_script import KillAt

        run, step = os.environ["RF_TEST_KILL"].split(":")
        callbacks.append(KillAt(run, int(step)))
    trainer = RFSFTTrainer(model=tiny_model_path(), args=config,
                           train_dataset=make_sft_dataset(48, seed=1),
                           peft_config=tiny_lora_config(r=4), callbacks=callbacks)
    if stop:
        StopAt.trainer = trainer
        trainer.train()
        print("after stop:", {r.name: (r.status.value, r.global_step) for r in trainer.runs},
              flush=True)
        trainer.resume(stop_run)
    trainer.train()
    print({r.name: (r.knobs, r.status.value, r.global_step) for r in trainer.runs}, flush=True)


def plain(output_dir: str, lr: float, fsdp: bool) -> None:
    from trl import SFTConfig, SFTTrainer

    from trl_rapidfire.testing import make_sft_dataset, tiny_lora_config, tiny_model_path

    extra = dict(fsdp=FSDP, fsdp_config=FSDP_CONFIG, ddp_backend="gloo") if fsdp else {}
    trainer = SFTTrainer(model=tiny_model_path(),
                         args=SFTConfig(output_dir=output_dir, learning_rate=lr, **_common(),
                                        **extra),
                         train_dataset=make_sft_dataset(48, seed=1),
                         peft_config=tiny_lora_config(r=4))
    trainer.train()
    trainer.save_model(f"{output_dir}/final")


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "rf":
        rf(sys.argv[2])
    else:
        plain(sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1")
