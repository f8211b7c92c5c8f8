"""Drop-in fidelity: an RF trainer does what the TRL trainer it replaces does, subclassing
included. Every test runs plain TRL and trl-rapidfire side by side and compares behaviour:
calls made, files written, exception types, weights."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback
from trl import GRPOTrainer, SFTConfig, SFTTrainer

from trl_rapidfire import List, RFGRPOTrainer, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


COMMON = dict(cpu_training_kwargs(), per_device_train_batch_size=4, logging_steps=1,
              report_to="none")


class _Weighted:
    """A custom loss, the most common way to customise TRL: the loss times ``weight`` (an
    argument of the subclass's own ``__init__``), and a record of every call."""

    def __init__(self, *args, weight: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight = weight

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        CALLS[self.kind] += 1
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        if return_outputs:
            return loss[0] * self.weight, loss[1]
        return loss * self.weight


CALLS = {"plain": 0, "rf": 0}


class WeightedSFT(_Weighted, SFTTrainer):
    kind = "plain"


class WeightedRF(_Weighted, RFSFTTrainer):
    kind = "rf"


def test_a_subclass_override_runs_in_every_run_and_ends_bitwise_equal_to_plain_trl(tmp_path):
    data = make_sft_dataset(24, seed=3)
    lrs = [1e-3, 3e-3, 1e-2]
    lora = tiny_lora_config(r=4)
    config = dict(COMMON, num_train_epochs=1, seed=5)
    for i, lr in enumerate(lrs):
        plain = WeightedSFT(model=tiny_model_path(), weight=0.25, train_dataset=data,
                            args=SFTConfig(output_dir=str(tmp_path / f"plain-{i}"),
                                           learning_rate=lr, **config), peft_config=lora)
        plain.train()
        plain.save_model(str(tmp_path / f"plain-{i}" / "final"))
    rf = WeightedRF(model=tiny_model_path(), weight=0.25, train_dataset=data,
                    args=RFSFTConfig(output_dir=str(tmp_path / "rf"), learning_rate=List(lrs),
                                     num_chunks=3, **config), peft_config=lora)
    rf.train()
    # The same calls: every run's steps went through the override.
    assert CALLS["rf"] == CALLS["plain"] == 3 * 6
    assert all(isinstance(rf.run_trainer(f"run-{i}"), WeightedRF) for i in range(3))
    for i in range(3):
        want = load_file(tmp_path / f"plain-{i}" / "final" / "adapter_model.safetensors")
        got = load_file(tmp_path / "rf" / "runs" / f"run-{i}" / "final" /
                        "adapter_model.safetensors")
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want), f"run-{i} differs"


def test_overriding_what_the_engine_owns_is_refused_at_construction(tmp_path):
    class OwnTrain(RFSFTTrainer):
        def train(self, *args, **kwargs):  # noqa: D102
            return super().train(*args, **kwargs)

    with pytest.raises(TypeError, match=r"OwnTrain\.train overrides what trl-rapidfire owns"):
        OwnTrain(model=tiny_model_path(), train_dataset=make_sft_dataset(8),
                 args=RFSFTConfig(output_dir=str(tmp_path / "o"), max_steps=1, **COMMON))
    assert not (tmp_path / "o").exists()


def test_static_methods_and_class_attributes_stay_the_trl_trainers():
    for name, value in vars(GRPOTrainer).items():
        if isinstance(value, (staticmethod, classmethod)):
            assert type(vars(RFGRPOTrainer).get(name, value)) is type(value), name
            assert getattr(RFGRPOTrainer, name) == getattr(GRPOTrainer, name), name
    mask = GRPOTrainer.get_off_policy_mask if hasattr(GRPOTrainer, "get_off_policy_mask") \
        else None
    if mask is not None:
        assert RFGRPOTrainer.get_off_policy_mask is mask


def test_a_method_patched_on_the_rf_class_reaches_the_runs(tmp_path):
    # TRL's own tests patch the trainer class after building the trainer.
    trainer = RFSFTTrainer(model=tiny_model_path(), train_dataset=make_sft_dataset(8),
                           args=RFSFTConfig(output_dir=str(tmp_path / "o"), max_steps=2,
                                            **COMMON))
    original = SFTTrainer.training_step
    with mock.patch.object(RFSFTTrainer, "training_step", autospec=True,
                           side_effect=original) as patched:
        trainer.train()
    assert patched.call_count == 2


def test_plain_sft_trainer_calls_and_rf_calls_agree_for_a_subclass_log_override(tmp_path):
    seen: dict[str, list[int]] = {"plain": [], "rf": []}

    def logging(kind):
        class Logs:
            def log(self, logs, *args, **kwargs):
                if "loss" in logs:
                    seen[kind].append(self.state.global_step)
                return super().log(logs, *args, **kwargs)
        return Logs

    plain_cls = type("PlainLogs", (logging("plain"), SFTTrainer), {})
    rf_cls = type("RFLogs", (logging("rf"), RFSFTTrainer), {})
    data = make_sft_dataset(16)
    plain_cls(model=tiny_model_path(), train_dataset=data,
              args=SFTConfig(output_dir=str(tmp_path / "p"), max_steps=3, **COMMON)).train()
    rf_cls(model=tiny_model_path(), train_dataset=data,
           args=RFSFTConfig(output_dir=str(tmp_path / "r"), max_steps=3, **COMMON)).train()
    assert seen["plain"] == seen["rf"] == [1, 2, 3]


def _raised(build) -> BaseException:
    try:
        build()
    except Exception as err:  # noqa: BLE001 - the comparison is the point
        return err
    raise AssertionError("nothing was raised")


class _Boom(Exception):
    pass


class _RaiseAtStep2(TrainerCallback):
    """A callback raising the user's own exception type mid-training."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise _Boom("at step 2")


def test_a_single_config_raises_what_trl_raises_at_construction_and_in_training(tmp_path):
    data = make_sft_dataset(16)
    bad = dict(COMMON, max_steps=2, padding_free=True)
    plain = _raised(lambda: SFTTrainer(model=tiny_model_path(), train_dataset=data,
                                       args=SFTConfig(output_dir=str(tmp_path / "p"), **bad)))
    ours = _raised(lambda: RFSFTTrainer(model=tiny_model_path(), train_dataset=data,
                                        args=RFSFTConfig(output_dir=str(tmp_path / "r"), **bad)))
    assert type(ours) is type(plain) and str(plain) in str(ours)

    good = dict(COMMON, max_steps=4)
    plain = _raised(SFTTrainer(model=tiny_model_path(), train_dataset=data,
                               args=SFTConfig(output_dir=str(tmp_path / "p2"), **good),
                               callbacks=[_RaiseAtStep2()]).train)
    with pytest.warns(RuntimeWarning):
        ours = _raised(RFSFTTrainer(model=tiny_model_path(), train_dataset=data,
                                    args=RFSFTConfig(output_dir=str(tmp_path / "r2"), **good),
                                    callbacks=[_RaiseAtStep2()]).train)
    assert type(ours) is type(plain) is _Boom and str(ours) == str(plain)


def test_several_failed_runs_raise_a_run_failure_that_keeps_each_runs_exception(tmp_path):
    from trl_rapidfire.engine import RunFailure

    rf = RFSFTTrainer(model=tiny_model_path(), train_dataset=make_sft_dataset(16),
                      args=RFSFTConfig(output_dir=str(tmp_path / "r"), max_steps=4,
                                       learning_rate=List([1e-3, 3e-3]), **COMMON),
                      callbacks=[_RaiseAtStep2()])
    with pytest.warns(RuntimeWarning), pytest.raises(RunFailure) as info:
        rf.train()
    assert sorted(info.value.exceptions) == ["run-0", "run-1"]
    assert all(isinstance(e, _Boom) for e in info.value.exceptions.values())
    assert isinstance(info.value.__cause__, ExceptionGroup)


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_one_config_writes_its_checkpoints_and_saved_model_where_trl_does(tmp_path):
    data = make_sft_dataset(16)
    config = dict(COMMON, max_steps=4, save_strategy="steps", save_steps=2)
    plain = SFTTrainer(model=tiny_model_path(), train_dataset=data,
                       args=SFTConfig(output_dir=str(tmp_path / "p"), **config),
                       peft_config=tiny_lora_config(r=4))
    plain.train()
    plain.save_model()
    rf = RFSFTTrainer(model=tiny_model_path(), train_dataset=data,
                      args=RFSFTConfig(output_dir=str(tmp_path / "r"), **config),
                      peft_config=tiny_lora_config(r=4))
    rf.train()
    rf.save_model()
    for step in (2, 4):
        name = f"checkpoint-{step}"
        assert _files(tmp_path / "p" / name) == _files(tmp_path / "r" / name)
        for weights in ("adapter_model.safetensors",):
            want = load_file(tmp_path / "p" / name / weights)
            got = load_file(tmp_path / "r" / name / weights)
            assert all(torch.equal(want[k], got[k]) for k in want)
    top = {f for f in _files(tmp_path / "p") if "/" not in f}
    assert top <= _files(tmp_path / "r")  # save_model() wrote the same files to output_dir
    assert rf.state.global_step == plain.state.global_step == 4
    assert rf.args.output_dir == str(tmp_path / "r")
    # The run's own folder (its final adapter) is runs/run-0, as with several configs.
    assert rf.runs[0].final_dir == str(tmp_path / "r" / "runs" / "run-0" / "final")
    assert (tmp_path / "r" / "runs" / "run-0" / "final" / "adapter_model.safetensors").is_file()


def test_streamed_data_trains_in_chunks_of_steps_and_ends_as_plain_trl(tmp_path):
    from datasets import IterableDataset

    rows = make_sft_dataset(24, seed=2)
    stream = IterableDataset.from_generator(lambda: iter(rows))
    config = dict(COMMON, max_steps=5, seed=3)
    lrs = [1e-3, 3e-3]
    for lr in lrs:
        plain = SFTTrainer(model=tiny_model_path(), train_dataset=stream,
                           peft_config=tiny_lora_config(r=4),
                           args=SFTConfig(output_dir=str(tmp_path / f"p{lr}"), learning_rate=lr,
                                          **config))
        plain.train()
        plain.save_model(str(tmp_path / f"p{lr}" / "final"))
    rf = RFSFTTrainer(model=tiny_model_path(), train_dataset=stream,
                      peft_config=tiny_lora_config(r=4),
                      args=RFSFTConfig(output_dir=str(tmp_path / "r"), learning_rate=List(lrs),
                                       num_chunks=3, **config))
    rf.train()
    # Interleaved: each run was suspended mid-stream and went on where it was.
    assert [c.run for c in rf.schedule][:2] == ["run-0", "run-1"] and len(rf.schedule) == 6
    for i, lr in enumerate(lrs):
        want = load_file(tmp_path / f"p{lr}" / "final" / "adapter_model.safetensors")
        got = load_file(tmp_path / "r" / "runs" / f"run-{i}" / "final" /
                        "adapter_model.safetensors")
        assert all(torch.equal(want[k], got[k]) for k in want), f"run-{i} differs"


def test_building_writes_nothing_until_train(tmp_path):
    out = tmp_path / "o"
    trainer = RFSFTTrainer(model=tiny_model_path(), train_dataset=make_sft_dataset(8),
                           args=RFSFTConfig(output_dir=str(out), max_steps=1, **COMMON))
    assert not out.exists() or not any(out.iterdir())  # as plain TRL: at most an empty folder
    trainer.train()
    assert (out / "schedule.csv").is_file()


def test_another_experiment_in_the_same_output_dir_moves_the_old_one_aside(tmp_path):
    data = make_sft_dataset(16, seed=4)
    out = tmp_path / "o"
    config = dict(COMMON, max_steps=2, learning_rate=1e-3)
    RFSFTTrainer(model=tiny_model_path(), train_dataset=data, peft_config=tiny_lora_config(r=4),
                 args=RFSFTConfig(output_dir=str(out), **config)).train()
    # The same config but full fine-tuning: another experiment (the fingerprint sees
    # peft_config), which plain TRL would simply train in that folder.
    with pytest.warns(UserWarning, match="moved, whole, to"):
        second = RFSFTTrainer(model=tiny_model_path(), train_dataset=data,
                              args=RFSFTConfig(output_dir=str(out), **config))
    second.train()
    (moved,) = (out / "previous").iterdir()
    assert (moved / "runs" / "run-0" / "final" / "adapter_model.safetensors").is_file()
    assert (moved / "schedule.csv").is_file() and (moved / ".rapidfire").is_dir()
    plain = SFTTrainer(model=tiny_model_path(), train_dataset=data,
                       args=SFTConfig(output_dir=str(tmp_path / "p"), **config))
    plain.train()
    got = load_file(out / "runs" / "run-0" / "final" / "model.safetensors")
    want = {n: p.detach() for n, p in plain.model.named_parameters()}
    assert all(torch.equal(got[k], want[k]) for k in got)


def test_a_trainer_with_other_precision_settings_before_does_not_stop_ours(tmp_path):
    from trl import GRPOConfig

    from trl_rapidfire import RFGRPOConfig
    from trl_rapidfire.testing import make_grpo_dataset, reward_short

    kw = {k: v for k, v in COMMON.items() if k != "bf16"}
    grpo = dict(kw, use_cpu=True, max_steps=2, num_generations=4, max_completion_length=8,
                seed=11)  # bf16: TRL's default (True)
    finals = {}
    for side, cls, config in (("plain", GRPOTrainer, GRPOConfig),
                              ("rf", RFGRPOTrainer, RFGRPOConfig)):
        # A plain trainer built first, with bf16=False: accelerate's state is that one's.
        SFTTrainer(model=tiny_model_path(), train_dataset=make_sft_dataset(8),
                   args=SFTConfig(output_dir=str(tmp_path / f"{side}-sft"), bf16=False,
                                  use_cpu=True, max_steps=1, **kw))
        trainer = cls(model=tiny_model_path(), reward_funcs=reward_short,
                      train_dataset=make_grpo_dataset(8, seed=1),
                      peft_config=tiny_lora_config(r=4),
                      args=config(output_dir=str(tmp_path / side), **grpo))
        assert trainer.args.bf16
        trainer.train()
        trainer.save_model(str(tmp_path / side / "final"))
        finals[side] = load_file(tmp_path / side / "final" / "adapter_model.safetensors")
    assert all(torch.equal(finals["plain"][k], finals["rf"][k]) for k in finals["plain"])


def test_grpo_on_streamed_data_and_without_a_reward_source_behaves_as_trl(tmp_path):
    from datasets import IterableDataset
    from trl import GRPOConfig

    from trl_rapidfire import RFGRPOConfig
    from trl_rapidfire.testing import make_grpo_dataset, reward_short

    rows = make_grpo_dataset(16, seed=1)
    stream = IterableDataset.from_generator(lambda: iter(rows))
    grpo = dict(COMMON, max_steps=2, num_generations=4, max_completion_length=8, seed=3)
    finals, adjusted = {}, {}
    for side, cls, config in (("plain", GRPOTrainer, GRPOConfig),
                              ("rf", RFGRPOTrainer, RFGRPOConfig)):
        trainer = cls(model=tiny_model_path(), reward_funcs=reward_short, train_dataset=stream,
                      peft_config=tiny_lora_config(r=4),
                      args=config(output_dir=str(tmp_path / side), dataloader_num_workers=2,
                                  **grpo))
        # What TRL changes in the config for streamed data shows in trainer.args, as in TRL.
        adjusted[side] = (trainer.args.dataloader_num_workers,
                          trainer.args.accelerator_config.dispatch_batches)
        trainer.train()
        trainer.save_model(str(tmp_path / side / "final"))
        finals[side] = load_file(tmp_path / side / "final" / "adapter_model.safetensors")
    assert all(torch.equal(finals["plain"][k], finals["rf"][k]) for k in finals["plain"])
    assert adjusted["rf"] == adjusted["plain"] == (0, False)

    # No reward_funcs and no environment: TRL's own error, type and words.
    errors = [_raised(lambda cls=cls, config=config: cls(
        model=tiny_model_path(), train_dataset=rows,
        args=config(output_dir=str(tmp_path / "none"), **grpo)))
        for cls, config in ((GRPOTrainer, GRPOConfig), (RFGRPOTrainer, RFGRPOConfig))]
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) in str(errors[1])
    assert "reward" in str(errors[0]).lower()


def test_after_init_the_process_accelerate_state_is_the_trainers_as_in_plain_trl(tmp_path):
    """Rough edge (issue 36): TRL's own GRPO tests call a trainer method needing accelerate's
    state (``_get_per_token_logps_and_entropies``) right after ``__init__``; an RF trainer's
    ``__init__`` left the state empty, so it failed where plain TRL's worked."""
    from accelerate.state import AcceleratorState

    from trl_rapidfire.runtime.accelerate_state import restore_accelerate_state

    for side, cls, config in (("plain", SFTTrainer, SFTConfig),
                              ("rf", RFSFTTrainer, RFSFTConfig)):
        restore_accelerate_state([{}, {}, {}])  # a fresh process: nothing initialised
        trainer = cls(model=tiny_model_path(), train_dataset=make_sft_dataset(8),
                      peft_config=tiny_lora_config(r=4),
                      args=config(output_dir=str(tmp_path / side), max_steps=1, **COMMON))
        # What the method reads: the state's device and distributed type.
        assert AcceleratorState().distributed_type.value == "NO", side
        batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
        loss = trainer.compute_loss(trainer.model, trainer._prepare_inputs(batch))
        assert torch.isfinite(loss), side


def test_an_rf_trainer_built_without_init_names_the_missing_attribute():
    trainer = object.__new__(RFSFTTrainer)
    with pytest.raises(AttributeError, match="'RFSFTTrainer' object has no attribute 'model'"):
        _ = trainer.model
