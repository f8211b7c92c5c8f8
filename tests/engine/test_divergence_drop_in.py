"""Issue 47, defect 14: the divergence stop must not break the drop-in. TRL's own
``test_train_model_dtype`` (SFT and DPO: fp16 weights at lr 0.1 overflow by step 2; plain TRL
trains all 9 steps) passes with the RF classes: with one run, a diverged run warns once and
trains on as its TRL trainer does; with several (or ``stop_diverged=True``) it fails alone."""

from __future__ import annotations

import pytest
import torch
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from trl_rapidfire import List, RFConfigError, RFDPOTrainer, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.engine.divergence import RunDiverged
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_dpo_dataset,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

CASES = {"sft": (SFTConfig, SFTTrainer, RFSFTTrainer, make_sft_dataset),
         "dpo": (DPOConfig, DPOTrainer, RFDPOTrainer, make_dpo_dataset)}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _train_model_dtype(trainer_class, config_class, make, out) -> tuple[object, dict]:
    """TRL's test_train_model_dtype, on the tiny model: the trainer after train(), and the
    parameters before it."""
    args = config_class(output_dir=str(out), model_init_kwargs={"dtype": torch.float16},
                        learning_rate=0.1, **cpu_training_kwargs())
    trainer = trainer_class(model=tiny_model_path(), args=args, train_dataset=make(24))
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    return trainer, before


@pytest.mark.parametrize("kind", sorted(CASES))
def test_trls_train_model_dtype_passes_with_the_rf_class(tmp_path, kind):
    config_class, trl_class, rf_class, make = CASES[kind]
    with pytest.warns(RuntimeWarning, match=r"run-0 diverged: .* It trains on, as its TRL "
                                            r"trainer alone would"):
        rf, before = _train_model_dtype(rf_class, config_class, make, tmp_path / "rf")
    # TRL's assertions: a train loss, fp16 weights, every parameter changed.
    assert rf.state.log_history[-1]["train_loss"] is not None
    for name, old in before.items():
        new = rf.model.get_parameter(name)
        assert new.dtype == torch.float16
        if "layernorm" not in name:  # TRL's test skips these too
            assert not torch.allclose(old, new, rtol=1e-12, atol=1e-12), name
    # And what plain TRL does: all 9 steps, the same (finite) train loss, nan weights kept.
    trl, _ = _train_model_dtype(trl_class, config_class, make, tmp_path / "trl")
    assert rf.state.global_step == trl.state.global_step == 9
    assert rf.state.log_history[-1]["train_loss"] == trl.state.log_history[-1]["train_loss"]
    assert not all(torch.isfinite(p).all() for p in rf.model.parameters())
    (run,) = rf.runs
    assert run.status == RunStatus.COMPLETED
    assert "weights are not finite" in rf.run_trainer(run.name).rf_diverged


def test_one_run_with_stop_diverged_fails_as_before(tmp_path):
    args = RFSFTConfig(output_dir=str(tmp_path), model_init_kwargs={"dtype": torch.float16},
                       learning_rate=0.1, stop_diverged=True, **cpu_training_kwargs())
    rf = RFSFTTrainer(model=tiny_model_path(), args=args, train_dataset=make_sft_dataset(24))
    with pytest.raises(RunDiverged, match=r"run-0 diverged: .* at step \d+"):
        rf.train()


def _two_runs(out, **kwargs) -> RFSFTTrainer:
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 1e300]), num_chunks=2,
                         max_steps=4, **cpu_training_kwargs(), **kwargs),
        train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4))


def test_several_runs_stop_a_diverged_one_unless_told_not_to(tmp_path):
    with pytest.warns(RuntimeWarning, match="run-1 diverged"):
        stopping = _two_runs(tmp_path / "auto")
        stopping.train()
    assert [r.status for r in stopping.runs] == [RunStatus.COMPLETED, RunStatus.FAILED]
    with pytest.warns(RuntimeWarning, match="run-1 diverged: .* It trains on"):
        going = _two_runs(tmp_path / "off", stop_diverged=False)
        going.train()
    assert [r.status for r in going.runs] == [RunStatus.COMPLETED, RunStatus.COMPLETED]
    assert [r.global_step for r in going.runs] == [4, 4]


def test_stop_diverged_is_one_value_for_the_experiment(tmp_path):
    with pytest.raises(RFConfigError, match="stop_diverged` is True, False or None, got 'no'"):
        RFSFTConfig(output_dir=str(tmp_path), stop_diverged="no", **cpu_training_kwargs())
    with pytest.raises(RFConfigError, match="`stop_diverged`.*cannot be a knob"):
        RFSFTConfig(output_dir=str(tmp_path), stop_diverged=List([True, False]),
                    **cpu_training_kwargs())
