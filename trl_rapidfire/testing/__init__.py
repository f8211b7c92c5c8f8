"""Offline test bed: a tiny Llama, its own BPE tokenizer, synthetic datasets and reward functions.

Everything here is built locally and deterministically from a seed, so tests, examples and
benchmarks run on a CPU-only machine without network access. The model is small enough that a
few TRL training steps take well under a second, yet it is a real ``LlamaForCausalLM`` with a
real byte-level BPE tokenizer and chat template, so the code paths of TRL's trainers (SFT, DPO,
GRPO, KTO, Reward, RLOO, Distillation) are exercised for real.

One concept a module: :mod:`.problems` (the synthetic questions), :mod:`.tiny_model` (the
tokenizer, the model, their cache, a teacher), :mod:`.datasets` (rows in each trainer's format),
:mod:`.rewards` (reward functions), :mod:`.training` (tiny CPU training settings). None of them
imports the rest of ``trl_rapidfire`` but :func:`fsdp_on_cpu` (the mark it leaves for the wall).
"""

from .datasets import (
    make_dpo_dataset,
    make_grpo_dataset,
    make_kto_dataset,
    make_reward_dataset,
    make_sft_dataset,
)
from .problems import SYSTEM_PROMPT
from .rewards import reward_correct_answer, reward_short
from .tiny_model import (
    BOS_TOKEN,
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
    ROLE_TOKENS,
    TINY_MODEL_VERSION,
    build_model,
    build_tokenizer,
    save_tiny_model,
    tiny_model_path,
    tiny_teacher_path,
)
from .training import cpu_training_kwargs, fsdp_on_cpu, tiny_lora_config

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "ROLE_TOKENS",
    "SYSTEM_PROMPT",
    "TINY_MODEL_VERSION",
    "build_model",
    "build_tokenizer",
    "cpu_training_kwargs",
    "fsdp_on_cpu",
    "make_dpo_dataset",
    "make_grpo_dataset",
    "make_kto_dataset",
    "make_reward_dataset",
    "make_sft_dataset",
    "reward_correct_answer",
    "reward_short",
    "save_tiny_model",
    "tiny_lora_config",
    "tiny_model_path",
    "tiny_teacher_path",
]
