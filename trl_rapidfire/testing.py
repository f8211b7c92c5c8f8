"""Offline test bed: a tiny Llama, its own BPE tokenizer, synthetic datasets and reward functions.

Everything here is built locally and deterministically from a seed, so tests, examples and
benchmarks run on a CPU-only machine without network access. The model is small enough that a
few TRL training steps take well under a second, yet it is a real ``LlamaForCausalLM`` with a
real byte-level BPE tokenizer and chat template, so TRL's SFT, DPO and GRPO code paths are
exercised for real.

This module deliberately imports nothing from the rest of ``trl_rapidfire``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    TrainingArguments,
)

__all__ = [
    "TINY_MODEL_VERSION",
    "build_model",
    "build_tokenizer",
    "cpu_training_kwargs",
    "fsdp_on_cpu",
    "make_dpo_dataset",
    "make_grpo_dataset",
    "make_sft_dataset",
    "reward_correct_answer",
    "reward_short",
    "save_tiny_model",
    "tiny_lora_config",
    "tiny_model_path",
]

# Bump whenever the tokenizer, model or corpus recipe changes: it keys the on-disk cache, so a
# stale cached model from an older recipe is never picked up.
TINY_MODEL_VERSION = "1"

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "<|eot|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SYSTEM_PROMPT = "You are a careful assistant. Answer with one word or number."

# Role markers are special tokens with no whitespace around them, so a rendered prompt always
# ends on a token boundary: the tokenized prompt (with the generation prompt) is then an exact
# prefix of the tokenized prompt+completion, which TRL relies on to build completion masks.
# The {% generation %} block lets TRL's SFT `assistant_only_loss=True` find assistant tokens.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('Unsupported role: ' + message['role']) }}"
    "{%- endif %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|assistant|>' }}"
    "{%- generation %}{{- message['content'] + eos_token }}{%- endgeneration %}"
    "{%- else %}"
    "{{- '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)

_MAX_POSITIONS = 512
_TOKENIZER_CORPUS_SIZE = 4000
_SHORT_CAP_CHARS = 32
_COMPLETE_MARKER = "TINY_MODEL_COMPLETE.json"
_WORDS = (
    "apple", "river", "stone", "cloud", "green", "table",
    "music", "light", "horse", "paper", "sugar", "window",
)  # fmt: skip

SftKind = Literal["text", "prompt_completion", "messages"]


class _Problem(NamedTuple):
    question: str
    answer: str


def _make_problem(rng: random.Random) -> _Problem:
    task = rng.randrange(4)
    a, b = rng.randrange(10), rng.randrange(10)
    if task == 0:
        return _Problem(f"What is {a} plus {b}?", str(a + b))
    if task == 1:
        high, low = max(a, b), min(a, b)
        return _Problem(f"What is {high} minus {low}?", str(high - low))
    if task == 2:
        return _Problem(f"What comes after {a}?", str(a + 1))
    word = rng.choice(_WORDS)
    return _Problem(f"Repeat the word {word}.", word)


def _problems(n: int, seed: int) -> list[_Problem]:
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = random.Random(seed)
    return [_make_problem(rng) for _ in range(n)]


def _wrong_answer(answer: str, rng: random.Random) -> str:
    if answer.isdigit():
        candidates = [str(v) for v in range(int(answer) - 3, int(answer) + 4) if v >= 0]
    else:
        candidates = list(_WORDS)
    return rng.choice([c for c in candidates if c != answer])


def _corpus(seed: int) -> Iterable[str]:
    rng = random.Random(seed)
    yield SYSTEM_PROMPT
    for _ in range(_TOKENIZER_CORPUS_SIZE):
        problem = _make_problem(rng)
        yield f"{problem.question} {problem.answer}"


def build_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """Train a small byte-level BPE tokenizer on the synthetic language, wrapped for transformers.

    Special tokens: ``<pad>`` (padding, distinct from eos), ``<s>`` (bos, emitted by the chat
    template only; plain ``encode`` adds no special tokens), ``<|eot|>`` (end of turn, which is
    also the eos) and the role markers ``<|system|>``, ``<|user|>``, ``<|assistant|>``.
    The chat template supports ``add_generation_prompt`` and marks assistant turns with
    ``{% generation %}``. Byte-level, so any text round-trips through encode/decode.

    Args:
        seed: Seeds the corpus the merges are learned from; equal seeds give equal tokenizers.
    """
    specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps offsets exact, which char_to_token (assistant masks) relies on.
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=_MAX_POSITIONS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(
    tokenizer: PreTrainedTokenizerFast, seed: int = 0, **overrides: Any
) -> LlamaForCausalLM:
    """Build a randomly initialised 2-layer fp32 Llama sized for ``tokenizer``.

    Weights depend only on ``seed`` and the config; the caller's global torch RNG state is left
    untouched. The model is returned in eval mode, like ``from_pretrained`` returns it.

    Args:
        tokenizer: Supplies the vocabulary size and the pad/bos/eos ids.
        seed: Seed for weight initialisation.
        **overrides: Extra or replacement ``LlamaConfig`` fields (e.g. ``num_hidden_layers=1``).
    """
    config_kwargs: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": _MAX_POSITIONS,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    config_kwargs.update(overrides)
    config = LlamaConfig(**config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    # generate() reads these from generation_config, not from the model config.
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model.eval()


def _read_marker(path: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(path, _COMPLETE_MARKER), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _check_marker(path: str, marker: dict[str, Any], seed: int) -> str:
    expected = {"version": TINY_MODEL_VERSION, "seed": seed}
    if marker != expected:
        raise ValueError(f"{path} holds tiny model {marker}, not the requested {expected}")
    return path


def save_tiny_model(path: str | os.PathLike[str], seed: int = 0) -> str:
    """Save the tiny model and tokenizer to ``path`` (if not already there) and return ``path``.

    The result loads offline with ``AutoModelForCausalLM.from_pretrained(path)`` and
    ``AutoTokenizer.from_pretrained(path)``. The directory is built in a temporary sibling and
    renamed into place, with a marker file inside, so concurrent callers (threads or processes)
    never see a half-written model; whoever loses the rename race reuses the winner's copy.

    Raises:
        ValueError: ``path`` holds a tiny model of another seed or recipe version.
        FileExistsError: ``path`` is a non-empty directory that is not a saved tiny model.
    """
    path = os.path.abspath(os.fspath(path))
    marker = _read_marker(path)
    if marker is not None:
        return _check_marker(path, marker, seed)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        tokenizer = build_tokenizer(seed)
        build_model(tokenizer, seed).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        with open(os.path.join(staging, _COMPLETE_MARKER), "w", encoding="utf-8") as f:
            json.dump({"version": TINY_MODEL_VERSION, "seed": seed}, f)
        try:
            # rename() atomically replaces a missing or empty directory, never a non-empty one.
            os.rename(staging, path)
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            marker = _read_marker(path)
            if marker is None:
                raise FileExistsError(f"{path} exists and is not a saved tiny model") from None
            return _check_marker(path, marker, seed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def tiny_model_path(cache_dir: str | os.PathLike[str] | None = None, seed: int = 0) -> str:
    """Return the path of a saved tiny model in a cache directory, building it on first use.

    The cache directory is ``cache_dir``, else ``$TRL_RAPIDFIRE_TINY_CACHE``, else
    ``<system temp dir>/trl-rapidfire-tiny``. Entries are keyed by seed and
    ``TINY_MODEL_VERSION``.
    """
    if cache_dir is None:
        cache_dir = os.environ.get("TRL_RAPIDFIRE_TINY_CACHE") or os.path.join(
            tempfile.gettempdir(), "trl-rapidfire-tiny"
        )
    name = f"tiny-llama-v{TINY_MODEL_VERSION}-seed{seed}"
    return save_tiny_model(os.path.join(os.fspath(cache_dir), name), seed=seed)


def make_sft_dataset(n: int = 64, seed: int = 0, kind: SftKind = "text") -> Dataset:
    """Synthetic SFT data: short arithmetic, counting and copy questions with their answers.

    Args:
        n: Number of rows.
        seed: Equal seeds give equal datasets.
        kind: ``"text"`` gives a ``text`` column (``"What is 3 plus 4? 7"``);
            ``"prompt_completion"`` gives conversational ``prompt`` (one user message) and
            ``completion`` (one assistant message) columns; ``"messages"`` gives a ``messages``
            column holding a system, user, assistant conversation.
    """
    problems = _problems(n, seed)
    if kind == "text":
        return Dataset.from_dict({"text": [f"{p.question} {p.answer}" for p in problems]})
    if kind == "prompt_completion":
        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": p.question}] for p in problems],
                "completion": [[{"role": "assistant", "content": p.answer}] for p in problems],
            }
        )
    if kind == "messages":
        return Dataset.from_dict(
            {
                "messages": [
                    [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": p.question},
                        {"role": "assistant", "content": p.answer},
                    ]
                    for p in problems
                ]
            }
        )
    raise ValueError(f"kind must be 'text', 'prompt_completion' or 'messages', got {kind!r}")


def make_dpo_dataset(n: int = 64, seed: int = 0, conversational: bool = False) -> Dataset:
    """Synthetic preference data: ``prompt``, ``chosen`` (right answer), ``rejected`` (wrong one).

    Plain form: ``prompt`` is the question and ``chosen``/``rejected`` start with a space, so
    ``prompt + chosen`` reads like a row of ``make_sft_dataset(kind="text")``. Conversational
    form: ``prompt`` is one user message, ``chosen``/``rejected`` one assistant message each.
    """
    problems = _problems(n, seed)
    # A separate stream, so the questions match make_sft_dataset/make_grpo_dataset for a seed.
    wrong_rng = random.Random(f"dpo-rejected-{seed}")
    wrong = [_wrong_answer(p.answer, wrong_rng) for p in problems]
    if conversational:
        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": p.question}] for p in problems],
                "chosen": [[{"role": "assistant", "content": p.answer}] for p in problems],
                "rejected": [[{"role": "assistant", "content": w}] for w in wrong],
            }
        )
    return Dataset.from_dict(
        {
            "prompt": [p.question for p in problems],
            "chosen": [f" {p.answer}" for p in problems],
            "rejected": [f" {w}" for w in wrong],
        }
    )


def make_grpo_dataset(n: int = 64, seed: int = 0, conversational: bool = True) -> Dataset:
    """Synthetic RL prompts: ``prompt`` (one user message, or the bare question) and ``answer``.

    ``answer`` is the correct answer as a string; TRL passes it to reward functions as the
    ``answer`` keyword (see :func:`reward_correct_answer`).
    """
    problems = _problems(n, seed)
    prompts: list[Any] = (
        [[{"role": "user", "content": p.question}] for p in problems]
        if conversational
        else [p.question for p in problems]
    )
    return Dataset.from_dict({"prompt": prompts, "answer": [p.answer for p in problems]})


def _completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)


def reward_correct_answer(
    completions: Sequence[str | Sequence[dict[str, Any]]], answer: Sequence[str], **kwargs: Any
) -> list[float]:
    """TRL reward function: 1.0 where the completion contains its answer as a whole word, else 0.0.

    Whole-word matching keeps ``"17"`` from counting as a correct ``"7"``. Completions may be
    strings (plain prompts) or lists of message dicts (conversational prompts).
    """
    return [
        1.0 if re.search(rf"\b{re.escape(ans)}\b", _completion_text(completion)) else 0.0
        for completion, ans in zip(completions, answer, strict=True)
    ]


def reward_short(
    completions: Sequence[str | Sequence[dict[str, Any]]], **kwargs: Any
) -> list[float]:
    """TRL reward function preferring short completions: ``1 - chars / 32``, clipped to [0, 1]."""
    return [
        min(1.0, max(0.0, 1.0 - len(_completion_text(c).strip()) / _SHORT_CAP_CHARS))
        for c in completions
    ]


def _checkpointing_flag() -> str:
    names = {field.name for field in dataclasses.fields(TrainingArguments)}
    new_name = "activation_checkpointing"
    return new_name if new_name in names else "gradient_checkpointing"


def cpu_training_kwargs() -> dict[str, Any]:
    """Flags every tiny CPU run needs; splat into ``SFTConfig``, ``DPOConfig`` or ``GRPOConfig``.

    Only flags whose TRL 1.16 / transformers 5 default is wrong or costly for a tiny CPU run are
    set, and none that changes how a trainer picks its device or distributed mode.
    """
    return {
        # TRL configs default bf16 to True, and TrainingArguments then raises on a CPU-only
        # machine unless use_cpu=True. use_cpu is left out on purpose: it would also pin runs to
        # the CPU on GPU machines and, under torchrun, turns every trainer into a DDP run.
        "bf16": False,
        # TRL defaults gradient_checkpointing to True: on a ~124k-parameter model it saves no
        # memory and only recomputes forward passes. transformers 5 renamed the flag; setting
        # the new name also avoids the FutureWarning that the old one triggers on every config.
        _checkpointing_flag(): False,
        # Already the default in transformers 5; explicit because mlflow is installed, and an
        # "all" default (as in transformers 4) would make every tiny run log to ./mlflow.db.
        "report_to": "none",
        # Defaults to True; without an accelerator torch pins nothing and warns on every
        # DataLoader, and on a GPU the tiny batches gain nothing from pinned memory.
        "dataloader_pin_memory": False,
        # The default "steps" strategy writes a full checkpoint when training ends, even when
        # max_steps < save_steps: slow disk I/O that tiny runs never need.
        "save_strategy": "no",
        # Progress bars only clutter test and benchmark output (log dicts are still printed).
        "disable_tqdm": True,
    }


def tiny_lora_config(
    r: int = 8, target_modules: Sequence[str] = ("q_proj", "v_proj"), **kwargs: Any
) -> LoraConfig:
    """A ``LoraConfig`` for the tiny model (``task_type="CAUSAL_LM"``).

    Defaults to ``lora_alpha=2 * r`` and ``lora_dropout=0.0`` (dropout would only add noise to
    step-by-step comparisons); ``kwargs`` override these or add other ``LoraConfig`` fields.
    """
    options: dict[str, Any] = {"lora_alpha": 2 * r, "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}
    options.update(kwargs)
    return LoraConfig(r=r, target_modules=list(target_modules), **options)


def fsdp_on_cpu() -> None:
    """Make accelerate shard a trainer's model with FSDP on CPU, as it does on GPUs (tests).

    accelerate selects its FSDP mode only for GPU-like devices: on CPU a trainer given
    ``fsdp``/``fsdp_config`` under a launch is wrapped in DDP instead, silently, so neither
    plain TRL nor trl-rapidfire would ever run the sharded path here. After this call (once per
    process, before any trainer is built), an ``AcceleratorState`` that holds an FSDP plugin
    in a multi-process CPU world is in FSDP mode: ``Accelerator.prepare`` applies FSDP2's
    ``fully_shard`` (gloo collectives), parameters become ``DTensor`` shards, and the
    Trainer's FSDP checkpoint routines run. It is checked after every ``AcceleratorState()``
    construction because each one copies the process state's (CPU) mode over its own.

    Tests use it on both sides of an equivalence, the reference trained by plain TRL and the
    run trained by trl-rapidfire, so both shard.
    """
    # A test bed's patch of accelerate, kept out of the package's wall around accelerate
    # (runtime/accelerate_state.py), which only reads its mark.
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    from .runtime.accelerate_state import FSDP_ON_CPU_MARK, fsdp_on_cpu_installed

    if fsdp_on_cpu_installed():
        return
    original = AcceleratorState.__init__

    def init(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type != DistributedType.MULTI_CPU:
            return
        if fsdp_plugin is not None and getattr(self, "fsdp_plugin", None) is None:
            self.fsdp_plugin = fsdp_plugin  # what accelerate does for GPUs
        if getattr(self, "fsdp_plugin", None) is not None:
            self.distributed_type = DistributedType.FSDP

    setattr(init, FSDP_ON_CPU_MARK, True)
    AcceleratorState.__init__ = init
