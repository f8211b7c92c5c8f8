"""The tiny offline model: a 2-layer Llama with its own byte-level BPE tokenizer and chat
template, built from a seed and cached on disk (a second model of the same vocabulary serves
as a distillation teacher)."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from .problems import SYSTEM_PROMPT, make_problem

__all__ = [
    "EOS_TOKEN",
    "TINY_MODEL_VERSION",
    "build_model",
    "build_tokenizer",
    "save_tiny_model",
    "tiny_model_path",
    "tiny_teacher_path",
]

# Bump whenever the tokenizer, model or corpus recipe changes: it keys the on-disk cache, so a
# stale cached model from an older recipe is never picked up.
TINY_MODEL_VERSION = "1"

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "<|eot|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")

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
_COMPLETE_MARKER = "TINY_MODEL_COMPLETE.json"


def _corpus(seed: int) -> Iterable[str]:
    rng = random.Random(seed)
    yield SYSTEM_PROMPT
    for _ in range(_TOKENIZER_CORPUS_SIZE):
        problem = make_problem(rng)
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


def _marker(seed: int, teacher_seed: int | None) -> dict[str, Any]:
    marker: dict[str, Any] = {"version": TINY_MODEL_VERSION, "seed": seed}
    if teacher_seed is not None:
        marker["teacher_seed"] = teacher_seed
    return marker


def _check_marker(path: str, marker: dict[str, Any], expected: dict[str, Any]) -> str:
    if marker != expected:
        raise ValueError(f"{path} holds tiny model {marker}, not the requested {expected}")
    return path


def save_tiny_model(path: str | os.PathLike[str], seed: int = 0, *,
                    teacher_seed: int | None = None) -> str:
    """Save the tiny model and tokenizer to ``path`` (if not already there) and return ``path``.

    The result loads offline with ``AutoModelForCausalLM.from_pretrained(path)`` and
    ``AutoTokenizer.from_pretrained(path)``. The directory is built in a temporary sibling and
    renamed into place, with a marker file inside, so concurrent callers (threads or processes)
    never see a half-written model; whoever loses the rename race reuses the winner's copy.

    ``teacher_seed``: a teacher for distillation instead: the tokenizer of ``seed`` (the
    student's vocabulary), weights drawn from ``teacher_seed``, three layers instead of two.

    Raises:
        ValueError: ``path`` holds a tiny model of another seed or recipe version.
        FileExistsError: ``path`` is a non-empty directory that is not a saved tiny model.
    """
    path = os.path.abspath(os.fspath(path))
    expected = _marker(seed, teacher_seed)
    marker = _read_marker(path)
    if marker is not None:
        return _check_marker(path, marker, expected)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        tokenizer = build_tokenizer(seed)
        model = (build_model(tokenizer, seed) if teacher_seed is None
                 else build_model(tokenizer, teacher_seed, num_hidden_layers=3))
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        with open(os.path.join(staging, _COMPLETE_MARKER), "w", encoding="utf-8") as f:
            json.dump(expected, f)
        try:
            # rename() atomically replaces a missing or empty directory, never a non-empty one.
            os.rename(staging, path)
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            marker = _read_marker(path)
            if marker is None:
                raise FileExistsError(f"{path} exists and is not a saved tiny model") from None
            return _check_marker(path, marker, expected)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def tiny_model_path(cache_dir: str | os.PathLike[str] | None = None, seed: int = 0) -> str:
    """Return the path of a saved tiny model in a cache directory, building it on first use.

    The cache directory is ``cache_dir``, else ``$TRL_RAPIDFIRE_TINY_CACHE``, else
    ``<system temp dir>/trl-rapidfire-tiny``. Entries are keyed by seed and
    ``TINY_MODEL_VERSION``.
    """
    name = f"tiny-llama-v{TINY_MODEL_VERSION}-seed{seed}"
    return save_tiny_model(os.path.join(_cache_dir(cache_dir), name), seed=seed)


def tiny_teacher_path(cache_dir: str | os.PathLike[str] | None = None, seed: int = 1) -> str:
    """A distillation teacher for the tiny model of seed 0: its vocabulary and tokenizer,
    three layers, weights drawn from ``seed`` (a teacher equal to the student would teach
    nothing: its loss is 0). Cached as :func:`tiny_model_path` is."""
    name = f"tiny-teacher-v{TINY_MODEL_VERSION}-seed{seed}"
    return save_tiny_model(os.path.join(_cache_dir(cache_dir), name), seed=0, teacher_seed=seed)


def _cache_dir(cache_dir: str | os.PathLike[str] | None) -> str:
    if cache_dir is None:
        return os.environ.get("TRL_RAPIDFIRE_TINY_CACHE") or os.path.join(
            tempfile.gettempdir(), "trl-rapidfire-tiny")
    return os.fspath(cache_dir)
