"""report_to=["tensorboard"]: every run writes a TensorBoard stream of its own, at its own
steps, beside (or without) MLflow, which stays the control channel."""

from __future__ import annotations

from pathlib import Path

import pytest

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


def test_every_run_has_its_own_tensorboard_stream(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    kwargs = dict(cpu_training_kwargs(), report_to=["tensorboard"])
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List([1e-3, 3e-3]),
                         num_chunks=3, per_device_train_batch_size=4, num_train_epochs=1,
                         logging_steps=1, **kwargs),
        train_dataset=make_sft_dataset(24), peft_config=tiny_lora_config(r=4),
    )
    rf.train()
    for run in rf.runs:
        files = list(Path(run.output_dir).rglob("events.out.tfevents*"))
        assert len(files) == 1, files  # one stream per run, not one per chunk
        events = EventAccumulator(str(files[0].parent))
        events.Reload()
        losses = events.Scalars("train/loss")
        assert [e.step for e in losses] == list(range(1, run.global_step + 1))
        logged = [h["loss"] for h in rf.run_trainer(run.name).state.log_history if "loss" in h]
        assert [e.value for e in losses] == pytest.approx(logged, rel=1e-6)
