"""A stopped run's state is written between turns (its boundary was volatile: the default
cadence writes every 60 s), and so is every run's when it leaves the worker at the end of
train(). A link met on that write's way concerns that run alone, the path named: a stopped run
stays stopped (said in a warning), a running one fails; the others train on and nothing is
written outside (docs/security.md, "Links in the experiment's folder")."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from test_one_write_path import Outside, _plant  # the same planted links
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

_TRAINER: dict = {}  # module-level: each run's trainer gets its own copy of the callbacks


def _two_runs(out: Path, callback: TrainerCallback) -> RFSFTTrainer:
    """Two runs of 4 one-step chunks, boundaries volatile (the default cadence)."""
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), num_chunks=4, max_steps=4,
                         learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                         **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4),
        callbacks=[callback])
    _TRAINER["rf"] = trainer
    return trainer


class StopAfterSwap(TrainerCallback):
    """Once run-0 has trained two steps: its checkpoint folder becomes a link out, and a
    person stops it (its state, volatile, is then written between turns)."""

    def __init__(self, path: Path, outside: Outside) -> None:
        self.path, self.outside, self.done = path, outside, False

    def on_step_end(self, args, state, control, **kwargs):
        if not self.done and Path(args.output_dir).name == "run-0" and state.global_step >= 2:
            self.done = True
            thread = threading.Thread(target=_plant, args=(self.path, "folder", self.outside))
            thread.start()
            thread.join()
            _TRAINER["rf"].stop("run-0")


def test_a_link_met_by_a_stopped_runs_write_concerns_that_run_alone(tmp_path):
    out, outside = tmp_path / "out", Outside(tmp_path)
    path = out / ".rapidfire" / "checkpoints" / "run-0"
    trainer = _two_runs(out, StopAfterSwap(path, outside))
    with pytest.warns(RuntimeWarning, match=f"run-0: writing its checkpoint failed: {path}"):
        trainer.train()
    runs = {r.name: r for r in trainer.runs}
    assert runs["run-0"].status == RunStatus.STOPPED
    assert runs["run-1"].status == RunStatus.COMPLETED
    assert (out / "runs" / "run-1" / "final" / "adapter_model.safetensors").is_file()
    assert outside.unchanged()


class SwapAtTheLastStep(TrainerCallback):
    """run-0's checkpoint folder becomes a link out at its last step but one: the end of
    train() writes its volatile boundary there (it leaves the worker while still running)."""

    def __init__(self, path: Path, outside: Outside) -> None:
        self.path, self.outside, self.done = path, outside, False

    def on_step_end(self, args, state, control, **kwargs):
        if not self.done and Path(args.output_dir).name == "run-0" and state.global_step >= 2:
            self.done = True
            _plant(self.path, "folder", self.outside)
            _TRAINER["rf"].engine.interrupted = True  # train() ends at this boundary


def test_a_link_met_by_a_leaving_runs_write_fails_that_run_alone(tmp_path):
    out, outside = tmp_path / "out", Outside(tmp_path)
    path = out / ".rapidfire" / "checkpoints" / "run-0"
    trainer = _two_runs(out, SwapAtTheLastStep(path, outside))
    with pytest.warns(RuntimeWarning, match="run-0"), pytest.raises(KeyboardInterrupt):
        trainer.train()  # stopped at a boundary, as by Ctrl-C
    runs = {r.name: r for r in trainer.runs}
    assert runs["run-0"].status == RunStatus.FAILED
    assert str(path) in runs["run-0"].error
    assert runs["run-1"].status == RunStatus.RUNNING  # interrupted: a re-run continues it
    assert outside.unchanged()
