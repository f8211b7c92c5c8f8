"""RFDPOTrainer and RFGRPOTrainer: the same guarantee as SFT, bitwise against plain TRL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

from trl_rapidfire import GridSearch, List, RFDPOConfig, RFDPOTrainer, RFGRPOConfig, RFGRPOTrainer
from trl_rapidfire.runtime.model_pool import module_bytes
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_dpo_dataset,
    make_grpo_dataset,
    reward_correct_answer,
    reward_short,
    tiny_lora_config,
    tiny_model_path,
)
from trl_rapidfire.trainers.grpo import generation_cycle_steps

SPEED_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second",
              "step_time"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_path():
    return tiny_model_path()


def _logs(trainer) -> list[dict]:
    return [{k: v for k, v in e.items() if k not in SPEED_KEYS} for e in trainer.state.log_history]


def _same_adapter(a: Path, b: Path) -> bool:
    x = load_file(Path(a) / "adapter_model.safetensors")
    y = load_file(Path(b) / "adapter_model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


DPO_COMMON = dict(cpu_training_kwargs(), per_device_train_batch_size=4, logging_steps=1,
                  num_train_epochs=1, warmup_steps=0.2, learning_rate=1e-3)


def test_four_dpo_configs_equal_plain_dpo_bitwise_on_one_base_model(model_path, tmp_path):
    data = make_dpo_dataset(24)
    lora = tiny_lora_config(r=4, lora_dropout=0.1)
    rf = RFDPOTrainer(
        model=model_path,
        args=RFDPOConfig(output_dir=str(tmp_path / "rf"), num_chunks=3, beta=List([0.1, 0.5]),
                         loss_type=List(["sigmoid", "hinge"]), **DPO_COMMON),
        train_dataset=data,
        peft_config=lora,
    )
    # Memory: one base model for the 4 runs, no reference copy and no "ref" adapter per run.
    assert list(rf.model_loads.values()) == [1]
    model = rf.run_trainer("run-0").model
    assert all(rf.run_trainer(f"run-{i}").model is model for i in range(4))
    assert all(rf.run_trainer(f"run-{i}").ref_model is None for i in range(4))
    assert sorted(model.peft_config) == ["rf0", "rf1", "rf2", "rf3"]
    # The dataset was prepared once for the 4 runs (their preparation settings agree).
    assert len({id(rf.run_trainer(f"run-{i}").train_dataset) for i in range(4)}) == 1
    base = module_bytes(model.get_base_model()) - sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)
    single = DPOTrainer(model=model_path, train_dataset=data, peft_config=lora,
                        args=DPOConfig(output_dir=str(tmp_path / "one"), **DPO_COMMON)).model
    assert base == module_bytes(single.get_base_model()) - sum(
        p.numel() * p.element_size() for n, p in single.named_parameters() if "lora_" in n)
    rf.train()

    assert len(rf.schedule) == 4 * 3
    for run in rf.runs:
        assert run.status == RunStatus.COMPLETED
        ref = DPOTrainer(model=model_path, train_dataset=data, peft_config=lora,
                         args=DPOConfig(output_dir=str(tmp_path / run.name),
                                        **{**DPO_COMMON, **run.knobs}))
        ref.train()
        ref.save_model()
        assert _same_adapter(Path(run.output_dir) / "final", tmp_path / run.name), run.knobs
        logs = _logs(rf.run_trainer(run.name))
        assert logs == _logs(ref) and any("rewards/chosen" in e for e in logs)


# beta > 0: the KL term needs the reference, which is the shared base model (adapters off).
GRPO_COMMON = dict(cpu_training_kwargs(), per_device_train_batch_size=4, num_generations=4,
                   max_completion_length=8, steps_per_generation=2, logging_steps=1,
                   num_train_epochs=1, warmup_steps=0.2, beta=0.04)


def test_four_grpo_configs_equal_plain_grpo_bitwise_on_whole_generation_cycles(model_path,
                                                                               tmp_path):
    # 10 steps in 3 chunks: an even split (3.3 steps) would cut generation cycles of 2 steps
    data = make_grpo_dataset(10)
    lora = tiny_lora_config(r=4, lora_dropout=0.1)
    rf = RFGRPOTrainer(
        model=model_path,
        reward_funcs=List([[reward_correct_answer, reward_short], [reward_short]]),
        args=RFGRPOConfig(output_dir=str(tmp_path / "rf"), num_chunks=3,
                          learning_rate=List([1e-3, 3e-3]),
                          reward_weights=List([[1.0, 0.5], [1.0]]), **GRPO_COMMON),
        train_dataset=data,
        peft_config=lora,
        search=GridSearch(zip=[("reward_funcs", "reward_weights")]),
    )
    rf.train()
    cycle = generation_cycle_steps(rf.run_trainer("run-0").args)
    assert cycle == 2
    for record in rf.schedule:  # a boundary never falls inside a generation cycle
        assert record.start_step % cycle == 0
        assert record.end_step % cycle == 0
    assert len(rf.schedule) == 4 * 3
    for run in rf.runs:
        knobs = dict(run.knobs)
        funcs = knobs.pop("reward_funcs")
        ref = GRPOTrainer(model=model_path, reward_funcs=funcs, train_dataset=data,
                          peft_config=lora,
                          args=GRPOConfig(output_dir=str(tmp_path / run.name),
                                          **{**GRPO_COMMON, **knobs}))
        ref.train()
        ref.save_model()
        assert _same_adapter(Path(run.output_dir) / "final", tmp_path / run.name), run.name
        logs = _logs(rf.run_trainer(run.name))
        assert logs == _logs(ref) and any("reward" in e for e in logs)
        assert any(e.get("kl", 0) > 0 for e in logs)
    assert sorted(rf.run_trainer("run-0").model.peft_config) == ["rf0", "rf1", "rf2", "rf3"]


def test_generation_cycle_rounding():
    class A:
        steps_per_generation, num_iterations, gradient_accumulation_steps = 2, 1, 1

    assert generation_cycle_steps(A) == 2
    A.num_iterations, A.gradient_accumulation_steps = 2, 2  # 4 micro-steps = 2 optimizer steps
    assert generation_cycle_steps(A) == 2
    A.steps_per_generation, A.num_iterations, A.gradient_accumulation_steps = 3, 1, 2
    assert generation_cycle_steps(A) == 3  # lcm(3, 2) micro-steps = 6 = 3 optimizer steps


class _CurriculumReward:
    """A stateful reward: its bonus grows with the number of calls it has seen."""

    __name__ = "curriculum"

    def __init__(self):
        self.calls = 0

    def __call__(self, completions, **kwargs):
        self.calls += 1
        return [0.1 * self.calls * (len(str(c)) % 3) for c in completions]

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def test_stateful_reward_functions_keep_one_state_per_run(model_path, tmp_path):
    data = make_grpo_dataset(8)
    shared = _CurriculumReward()
    lora = tiny_lora_config(r=4)
    common = dict(GRPO_COMMON, warmup_steps=0.0)
    rf = RFGRPOTrainer(
        model=model_path, reward_funcs=[shared], train_dataset=data, peft_config=lora,
        args=RFGRPOConfig(output_dir=str(tmp_path / "rf"), num_chunks=2,
                          learning_rate=List([1e-3, 3e-3]), **common),
    )
    rf.train()
    for run in rf.runs:
        alone = _CurriculumReward()
        ref = GRPOTrainer(model=model_path, reward_funcs=[alone], train_dataset=data,
                          peft_config=lora,
                          args=GRPOConfig(output_dir=str(tmp_path / run.name),
                                          **{**common, **run.knobs}))
        ref.train()
        ref.save_model()
        assert _same_adapter(Path(run.output_dir) / "final", tmp_path / run.name), run.name
        assert _logs(rf.run_trainer(run.name)) == _logs(ref)


def test_single_config_dpo_equals_dpo_trainer_including_save_model(model_path, tmp_path):
    data = make_dpo_dataset(16)
    lora = tiny_lora_config(r=4, lora_dropout=0.1)
    rf = RFDPOTrainer(model=model_path, train_dataset=data, peft_config=lora,
                      args=RFDPOConfig(output_dir=str(tmp_path / "rf"), num_chunks=2,
                                       **DPO_COMMON))
    rf.train()
    rf.save_model()
    ref = DPOTrainer(model=model_path, train_dataset=data, peft_config=lora,
                     args=DPOConfig(output_dir=str(tmp_path / "ref"), **DPO_COMMON))
    ref.train()
    ref.save_model()
    assert _logs(rf) == _logs(ref)
    assert _same_adapter(tmp_path / "rf", tmp_path / "ref")


def test_an_optuna_search_over_reward_sets_proposes_grpo_runs_equal_plain_grpo(model_path,
                                                                              tmp_path):
    optuna = pytest.importorskip("optuna")
    from trl_rapidfire import OptunaSearch, Range

    data = make_grpo_dataset(10)
    lora = tiny_lora_config(r=4, lora_dropout=0.1)
    sets = [[reward_correct_answer, reward_short], [reward_short]]
    rf = RFGRPOTrainer(
        model=model_path, reward_funcs=List(sets),
        args=RFGRPOConfig(output_dir=str(tmp_path / "rf"), num_chunks=2,
                          learning_rate=Range(1e-4, 1e-2, log=True),
                          reward_weights=List([[1.0, 0.5], [1.0]]), **GRPO_COMMON),
        train_dataset=data, peft_config=lora,
        search=OptunaSearch(num_runs=3, max_concurrent=2, metric="reward",
                            direction="maximize", seed=1,
                            zip=[("reward_funcs", "reward_weights")]),
    )
    rf.train()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(tmp_path / "rf" / ".rapidfire" / "optuna.journal")))
    trials = optuna.load_study(study_name="trl-rapidfire", storage=storage).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    # The reward sets are one parameter, chosen by position.
    assert trials[0].distributions["reward_funcs+reward_weights"].choices == (0, 1)
    for trial in trials:
        run = next(r for r in rf.runs if r.name == trial.user_attrs["run"])
        index = trial.params["reward_funcs+reward_weights"]
        assert run.knobs["reward_funcs"] == sets[index]
        rewards = [e["reward"] for e in rf.run_trainer(run.name).state.log_history
                   if "reward" in e]
        assert trial.value == rewards[-1]  # maximized: the last reward logged
        knobs = dict(run.knobs)
        funcs = knobs.pop("reward_funcs")
        ref = GRPOTrainer(model=model_path, reward_funcs=funcs, train_dataset=data,
                          peft_config=lora,
                          args=GRPOConfig(output_dir=str(tmp_path / run.name),
                                          **{**GRPO_COMMON, **knobs}))
        ref.train()
        ref.save_model()
        assert _same_adapter(Path(run.output_dir) / "final", tmp_path / run.name), run.name
