"""An experiment script as a user writes it, for the multi-process tests (workers, crashes).

    python tests/experiment_script.py OUTPUT_DIR
    accelerate launch --multi_gpu --num_processes 2 ... tests/experiment_script.py OUTPUT_DIR

4 LoRA configs x 3 chunks on the tiny offline model. ``use_cpu=True`` and
``ddp_backend="gloo"`` are the settings under which transformers does detect a launch on CPU
(so without trl-rapidfire's workers every trainer would be wrapped in DDP).

``RF_TEST_KILL=<run>:<step>[:peer|:durable]`` kills the whole experiment (its process group,
like a ``kill -9`` of the launcher) when that run (or ``any``) begins that optimizer step:
mid-chunk, never at a boundary; with ``peer``, only once another worker has claimed a chunk;
with ``durable``, only once some run has a boundary on disk (another worker may be writing it).
``RF_TEST_ROWS`` sets the dataset size (longer chunks for timing); ``RF_TEST_EPOCHS`` the
epochs (default 1); ``RF_TEST_RANKS=4,8`` makes the LoRA rank a knob too (8 configs).
``RF_TEST_STOP=<run>`` stops that run from the script before training.
``RF_TEST_CHECKPOINT_EVERY`` sets ``checkpoint_every`` (default: the config's, 60 s: every
boundary of these short runs is volatile until a run stops, leaves or finishes).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


class KillAt(TrainerCallback):
    """SIGKILL the experiment's process group when the run reaches ``step`` (mid-chunk).

    ``run`` may be ``any``. With ``wait="peer"``, first wait (holding the run's claim) until
    another worker has claimed a chunk, or waits for this one's volatile runs: the kill then
    happens while that worker is running. With ``wait="durable"``, first wait until some run
    has a durable boundary: with two workers the other one may be mid-chunk, or its checkpoint
    writer mid-write, when this run reaches the step, and a test that needs something durable
    before the kill must not depend on which comes first.
    """

    def __init__(self, run: str, step: int, wait: str = "", output_dir: str = "") -> None:
        self.run, self.step, self.wait, self.output_dir = run, step, wait, output_dir

    def on_step_begin(self, args, state, control, **kwargs):
        mine = self.run == "any" or args.output_dir.endswith(self.run)
        if mine and state.global_step == self.step:
            if self.wait == "peer":
                self._wait_until(self._a_peer_works)
            elif self.wait == "durable":
                self._wait_until(self._a_boundary_is_durable)
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def _wait_until(self, condition) -> None:
        store = FileStore(os.path.join(self.output_dir, ".rapidfire"), "", create=False)
        deadline = time.time() + 300
        while time.time() < deadline and not condition(store.peek()):
            time.sleep(0.1)

    @staticmethod
    def _a_peer_works(state) -> bool:
        me = f":{os.getpid()}:"
        # Another worker trains, or waits for runs this one holds volatile (it gets them
        # at this worker's next claim, which never comes: it dies first).
        return any(me not in c.worker for c in state.claims.values()) or any(
            me not in w for w in state.idle)

    @staticmethod
    def _a_boundary_is_durable(state) -> bool:
        return any(run.durable_chunks for run in state.runs.values())


def main(output_dir: str) -> None:
    torch.set_num_threads(1)
    rows = int(os.environ.get("RF_TEST_ROWS", "96"))
    kwargs = dict(cpu_training_kwargs(), use_cpu=True, ddp_backend="gloo")
    kwargs["report_to"] = os.environ.get("RF_TEST_REPORT_TO", "none")
    if os.environ.get("RF_TEST_CHECKPOINT_EVERY"):
        kwargs["checkpoint_every"] = os.environ["RF_TEST_CHECKPOINT_EVERY"]
    config = RFSFTConfig(
        output_dir=output_dir,
        learning_rate=List([1e-3, 3e-3]),
        lr_scheduler_type=List(["linear", "cosine"]),
        warmup_steps=2,
        per_device_train_batch_size=4,
        num_train_epochs=int(os.environ.get("RF_TEST_EPOCHS", "1")),
        num_chunks=3,
        logging_steps=1,
        seed=7,
        **kwargs,
    )

    callbacks = []
    kill = os.environ.get("RF_TEST_KILL")
    if kill:
        run, step, *wait = kill.split(":")
        callbacks.append(KillAt(run, int(step), "".join(wait), output_dir))
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=config,
        train_dataset=make_sft_dataset(rows, seed=3),
        peft_config=List([tiny_lora_config(r=int(r), lora_dropout=0.1)
                          for r in os.environ.get("RF_TEST_RANKS", "8").split(",")]),
        callbacks=callbacks,
    )
    stop = os.environ.get("RF_TEST_STOP")
    if stop:
        trainer.stop(stop)  # every worker runs this line; the op must apply once
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1])
