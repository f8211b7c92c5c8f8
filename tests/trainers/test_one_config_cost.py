"""One config costs what plain TRL costs: between chunk boundaries, what trl-rapidfire runs
per optimizer step is a fixed handful of constant-time hooks, counted here.

Every call into ``trl_rapidfire`` during ``train()`` is counted (``sys.setprofile``) for one
config trained 8 steps and the same config trained 16 steps (same chunk count, so the chunk
boundaries and everything done at them are the same in number); the difference is the work
that grows with the steps. It must be exactly: the engine callback's ``on_step_begin`` and
``on_step_end`` (a set/dict lookup: is this step a boundary?), ``on_log`` and the run
trainer's ``log`` (one per log; ``logging_steps=1`` here) with its whole-run loss, and the run
trainer's ``floating_point_ops`` (which replaces the Trainer's own, cheaper: the Trainer
counts the model's parameters at every step). No state file, journal, tracker, cache or
scheduler call may appear per step.
"""

from __future__ import annotations

import collections
import sys

import pytest

from trl_rapidfire import RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

PER_STEP = {
    ("engine/callback.py", "on_step_begin"),
    ("engine/callback.py", "on_step_end"),
    ("engine/callback.py", "on_log"),
    ("trainers/run_trainer.py", "log"),
    ("trainers/run_trainer.py", "floating_point_ops"),
    ("trainers/log_state.py", "whole_run_train_loss"),
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _calls_while_training(tmp_path, rows: int) -> collections.Counter:
    calls: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename.replace("\\", "/")
            if "/trl_rapidfire/" in path:
                calls[(path.split("/trl_rapidfire/")[-1], frame.f_code.co_name)] += 1

    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / f"rows-{rows}"), num_chunks=2,
                         **dict(cpu_training_kwargs(), per_device_train_batch_size=8,
                                num_train_epochs=1, logging_steps=1)),
        train_dataset=make_sft_dataset(rows),
        peft_config=tiny_lora_config(),
    )
    sys.setprofile(profile)
    try:
        trainer.train()
    finally:
        sys.setprofile(None)
    assert trainer.state.global_step == rows // 8
    return calls


def test_per_step_work_is_a_fixed_set_of_constant_time_hooks(tmp_path):
    short = _calls_while_training(tmp_path, 64)   # 8 steps, 2 chunks
    long = _calls_while_training(tmp_path, 128)   # 16 steps, 2 chunks
    extra_steps = 8
    grown = {key: long[key] - short[key] for key in long if long[key] > short[key]}
    assert set(grown) == PER_STEP, sorted(set(grown) ^ PER_STEP)
    # One call each per step (per log: one log a step here), not more.
    assert all(count == extra_steps for count in grown.values()), grown
