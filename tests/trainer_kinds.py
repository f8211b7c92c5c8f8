"""The four trainer kinds added beside SFT/DPO/GRPO, described once for the tests that hold
each of them to plain TRL: how to build the plain TRL trainer and the RF trainer of one kind on
the tiny model, with what every run of that kind shares (data, LoRA, rewards, teacher)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from safetensors.torch import load_file
from trl import (
    DistillationConfig,
    DistillationTrainer,
    KTOConfig,
    KTOTrainer,
    RewardConfig,
    RewardTrainer,
    RLOOConfig,
    RLOOTrainer,
)

import trl_rapidfire as rf
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_grpo_dataset,
    make_kto_dataset,
    make_reward_dataset,
    make_sft_dataset,
    reward_correct_answer,
    reward_short,
    tiny_lora_config,
    tiny_model_path,
    tiny_teacher_path,
)

SPEED_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second",
              "step_time"}


@dataclass
class Kind:
    """One trainer kind: its plain and RF classes and what its tiny runs share."""

    name: str
    plain_trainer: type
    plain_config: type
    rf_trainer: type
    rf_config: type
    common: dict[str, Any]  # config fields every run shares
    shared: dict[str, Any] = field(default_factory=dict)  # trainer arguments every run shares
    metric: str = "eval_loss"  # what a policy reads on this kind

    def plain(self, folder: Path, **fields: Any) -> Any:
        """The plain TRL trainer of one run (``fields``: its config's own values)."""
        return self.plain_trainer(model=tiny_model_path(), **self.shared,
                                  args=self.plain_config(output_dir=str(folder),
                                                         **{**self.common, **fields}))

    def experiment(self, folder: Path, trainer: dict[str, Any] | None = None,
                   **fields: Any) -> Any:
        """The RF trainer of an experiment (``fields``: config fields, knobs included;
        ``trainer``: trainer arguments replacing the shared ones, knobs included)."""
        return self.rf_trainer(model=tiny_model_path(), **{**self.shared, **(trainer or {})},
                               args=self.rf_config(output_dir=str(folder),
                                                   **{**self.common, **fields}))


_COMMON = dict(cpu_training_kwargs(), per_device_train_batch_size=4, logging_steps=1,
               num_train_epochs=1, warmup_steps=0.2, learning_rate=1e-3)

KINDS = {
    "kto": Kind("kto", KTOTrainer, KTOConfig, rf.RFKTOTrainer, rf.RFKTOConfig,
                dict(_COMMON, max_length=32),
                dict(train_dataset=make_kto_dataset(16),
                     eval_dataset=make_kto_dataset(8, seed=1),
                     peft_config=tiny_lora_config(r=4, lora_dropout=0.1))),
    "reward": Kind("reward", RewardTrainer, RewardConfig, rf.RFRewardTrainer,
                   rf.RFRewardConfig, dict(_COMMON),
                   dict(train_dataset=make_reward_dataset(16),
                        eval_dataset=make_reward_dataset(8, seed=1),
                        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                               target_modules=["q_proj", "v_proj"],
                                               task_type="SEQ_CLS")),
                   metric="eval_accuracy"),
    "rloo": Kind("rloo", RLOOTrainer, RLOOConfig, rf.RFRLOOTrainer, rf.RFRLOOConfig,
                 dict(_COMMON, num_generations=2, max_completion_length=8,
                      generation_batch_size=4, beta=0.04),
                 dict(reward_funcs=[reward_correct_answer, reward_short],
                      train_dataset=make_grpo_dataset(12),
                      eval_dataset=make_grpo_dataset(4, seed=1),
                      peft_config=tiny_lora_config(r=4, lora_dropout=0.1))),
    "distillation": Kind("distillation", DistillationTrainer, DistillationConfig,
                         rf.RFDistillationTrainer, rf.RFDistillationConfig,
                         dict(_COMMON, max_completion_length=8),
                         dict(teacher_model=tiny_teacher_path(),
                              train_dataset=make_sft_dataset(12, kind="prompt_completion"),
                              eval_dataset=make_sft_dataset(4, seed=1,
                                                            kind="prompt_completion"),
                              peft_config=tiny_lora_config(r=4, lora_dropout=0.1))),
}


def logs(trainer: Any) -> list[dict]:
    """A trainer's log history without its timings."""
    return [{k: v for k, v in e.items() if k not in SPEED_KEYS} for e in trainer.state.log_history]


def same_adapter(a: Path, b: Path) -> bool:
    """Whether two saved adapters hold the same tensors, bitwise."""
    x = load_file(Path(a) / "adapter_model.safetensors")
    y = load_file(Path(b) / "adapter_model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
