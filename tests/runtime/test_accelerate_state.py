"""Building configs (as validation and expansion do) must not break a trainer built earlier."""

from __future__ import annotations

import pytest
from accelerate.state import AcceleratorState
from trl import SFTConfig, SFTTrainer

from trl_rapidfire import GridSearch, List, RFSFTConfig
from trl_rapidfire.runtime.accelerate_state import preserved_accelerate_state
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


def _trainer(tmp_path, model_path):
    args = SFTConfig(output_dir=str(tmp_path / "plain"), max_steps=2,
                     per_device_train_batch_size=4, logging_steps=1, **cpu_training_kwargs())
    return SFTTrainer(model=model_path, args=args, train_dataset=make_sft_dataset(16),
                      peft_config=tiny_lora_config())


def test_a_bare_config_build_breaks_an_existing_trainer(tmp_path):
    """The trap itself: if transformers ever fixes it, the guard can go (this test will say)."""
    model_path = tiny_model_path()
    _trainer(tmp_path, model_path)
    assert AcceleratorState._shared_state
    SFTConfig(output_dir=str(tmp_path / "other"), **cpu_training_kwargs())
    assert not AcceleratorState._shared_state


def test_expanding_a_config_group_keeps_an_existing_trainer_working(tmp_path):
    model_path = tiny_model_path()
    trainer = _trainer(tmp_path, model_path)
    rf = RFSFTConfig(output_dir=str(tmp_path / "rf"), learning_rate=List([1e-4, 1e-3]),
                     eval_strategy="chunk", **cpu_training_kwargs())
    runs = GridSearch().expand(rf)
    assert len(runs) == 2
    result = trainer.train()
    assert trainer.state.global_step == 2 and result.training_loss > 0


def test_guard_restores_state_after_an_error(tmp_path):
    model_path = tiny_model_path()
    trainer = _trainer(tmp_path, model_path)
    before = dict(AcceleratorState._shared_state)
    with pytest.raises(ValueError), preserved_accelerate_state():
        SFTConfig(output_dir=str(tmp_path / "x"), lr_scheduler_type="bogus",
                  **cpu_training_kwargs())
    assert AcceleratorState._shared_state == before
    trainer.train()
    assert trainer.state.global_step == 2
