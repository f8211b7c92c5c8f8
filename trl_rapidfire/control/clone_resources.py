"""What a clone would take of the machine, estimated before anything of it is built.

A clone's values that size work are checked two ways:

* hard caps: ``dataloader_num_workers`` at most the machine's CPUs, ``dataloader_prefetch_factor``
  at most :data:`MAX_PREFETCH_FACTOR`, a generation length (``max_completion_length``,
  ``max_new_tokens``, in a generation config or generation kwargs too) at most
  :data:`MAX_GENERATION_TOKENS` and the model's context window;
* memory: an estimate in bytes (the LoRA adapter with its gradient and two Adam moments, from
  its rank and target modules; activations and logits from the batch and the sequence length;
  the KV cache and logits of generation; the batches the DataLoader's workers hold) against
  :data:`MEMORY_SHARE` of the free memory of the device the runs train on (the GPU's free
  memory when torch has CUDA, else the host's ``MemAvailable``): what the clone adds, its own
  adapter and optimizer states and its growth over the parent's transient memory.

Only what the clone changes is held to them: a value the parent already had is the author's,
and a clone that needs no more memory than its parent is never refused. The estimate is rough
(within a small factor for decoder-only transformers), on purpose on the high side; fields are
found by their names (:data:`LENGTH_FIELDS`, ...), never by the trainer's kind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MAX_GENERATION_TOKENS", "MAX_PREFETCH_FACTOR", "MEMORY_SHARE", "Estimate",
           "ModelShape", "ResourceProblem", "clone_values",
           "estimate", "free_memory_bytes", "model_shape_of", "resource_problems"]

MAX_GENERATION_TOKENS = 65_536
"""The longest generation a clone may ask for: ``config.generation.MAX_NEW_TOKENS`` (a test
holds them equal; not imported, that module loads transformers and the client imports this
one)."""

MAX_PREFETCH_FACTOR = 16
"""Batches each DataLoader worker loads ahead (torch's default is 2)."""

MEMORY_SHARE = 0.5
"""The share of the device's free memory one clone may be estimated to take: the other runs
and the estimate's own error need the rest."""

LENGTH_FIELDS = ("max_length", "max_seq_length", "pad_to_multiple_of")
PROMPT_FIELDS = ("max_prompt_length",)
GENERATION_FIELDS = ("max_completion_length", "max_new_tokens")
GENERATION_CONTAINERS = ("generation_config", "generation_kwargs")
BATCH_FIELDS = ("per_device_train_batch_size", "per_device_eval_batch_size",
                "generation_batch_size", "num_generations")
_ACTIVATION_BYTES = 34  # bytes a token keeps per layer per unit of hidden size (fp32, no flash)
_WORKER_BYTES = 256 << 20  # a DataLoader worker process, before its batches
_TOKEN_BYTES = 24  # input ids, attention mask and labels: int64 each


@dataclass(frozen=True)
class ModelShape:
    """The sizes of the model a clone trains, from its config (``config.json``)."""

    hidden_size: int
    num_layers: int
    vocab_size: int
    intermediate_size: int
    context: int | None  # max_position_embeddings, when the config says

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape | None:
        """The shape a ``config.json`` mapping gives (a multimodal model's text part), or
        ``None`` when it names no hidden size or layer count."""
        text = config.get("text_config")
        if isinstance(text, Mapping) and "hidden_size" not in config:
            config = text

        def number(*names: str) -> int | None:
            for name in names:
                value = config.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
            return None

        hidden = number("hidden_size", "d_model", "n_embd")
        layers = number("num_hidden_layers", "n_layer", "num_layers")
        if hidden is None or layers is None:
            return None
        return cls(hidden, layers, number("vocab_size") or 32_000,
                   number("intermediate_size", "ffn_dim", "n_inner") or 4 * hidden,
                   number("max_position_embeddings", "n_positions", "max_sequence_length"))


def model_shape_of(model: Any) -> ModelShape | None:
    """The shape of a trainer's ``model`` argument: a loaded model or its config (public
    ``config``/``to_dict``), a local folder's ``config.json``, or a hub model's ``config.json``
    when it is in the local cache (never downloaded, never code); ``None`` when unknown."""
    config = getattr(model, "config", model)
    if hasattr(config, "to_dict"):
        found = config.to_dict()
        return ModelShape.from_config(found) if isinstance(found, Mapping) else None
    if not isinstance(model, (str, os.PathLike)):
        return None
    path = Path(model) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        cached = try_to_load_from_cache(str(model), "config.json")
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        found = json.loads(path.read_text()[:1 << 20])
    except (OSError, ValueError):
        return None
    return ModelShape.from_config(found) if isinstance(found, dict) else None


def free_memory_bytes() -> int | None:
    """Free memory of the device runs train on: the GPU's when CUDA is in use, else the host's
    ``MemAvailable``; ``None`` when unknown. Torch is only asked when already loaded (the
    experiment's process): this module never loads the training stack."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        return int(cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Estimate:
    """A run's estimated memory, in bytes, by what takes it."""

    adapter: int = 0
    activations: int = 0
    generation: int = 0
    loader: int = 0

    @property
    def total(self) -> int:
        return self.adapter + self.activations + self.generation + self.loader

    def parts(self) -> str:
        """``adapter and optimizer 14.2 GiB, activations 0.1 GiB`` (the parts over 0)."""
        names = (("adapter and optimizer", self.adapter), ("activations", self.activations),
                 ("generation", self.generation), ("data loading", self.loader))
        return ", ".join(f"{what} {_gib(n)}" for what, n in names if n)


@dataclass(frozen=True)
class ResourceProblem:
    """A field of a clone past what the machine holds: the field, its value, the limit."""

    field: str
    value: Any
    limit: str
    why: str

    def message(self) -> str:
        """The refusal (or warning) in words, with what to do."""
        return (f"`{self.field}`={_shown(self.value)} is over {self.limit}: {self.why}. Lower "
                "it; a clone from outside is refused past this estimate whatever "
                "clone_overrides allows, a clone from the script (trainer.clone) is warned")


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _shown(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _count(value: Any) -> float:
    """A size field's number (0 for None, text, bools)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value) if value == value and value > 0 else 0.0


def _inner(value: Any, name: str) -> Any:
    """A generation container's field (a mapping's key, a config object's attribute)."""
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None) if value is not None and not isinstance(value, str) else None


def generation_lengths(values: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """Every generation length a run's values set, each with the key that sets it."""
    for name in GENERATION_FIELDS:
        yield name, values.get(name)
    for container in GENERATION_CONTAINERS:
        for name in ("max_new_tokens", "max_length"):
            yield f"{container}.{name}", _inner(values.get(container), name)


def estimate(values: Mapping[str, Any], shape: ModelShape | None) -> Estimate:
    """A run's estimated memory from its values (config fields and trainer arguments by
    name) and its model's shape (``None``: only what the model does not decide)."""
    batch = max([_count(values.get(n)) for n in BATCH_FIELDS] + [1.0])
    length = max(max(_count(values.get(n)) for n in LENGTH_FIELDS),
                 sum(_count(values.get(n)) for n in PROMPT_FIELDS + GENERATION_FIELDS))
    workers = _count(values.get("dataloader_num_workers"))
    prefetch = _count(values.get("dataloader_prefetch_factor")) or 2.0
    loader = workers * (_WORKER_BYTES + prefetch * batch * length * _TOKEN_BYTES)
    if shape is None:
        return Estimate(loader=int(min(loader, 1 << 62)))
    hidden, layers = shape.hidden_size, shape.num_layers
    peft = values.get("peft_config")
    rank = _count(getattr(peft, "r", None))
    pattern = getattr(peft, "rank_pattern", None)
    if isinstance(pattern, Mapping):
        rank = max([rank] + [_count(v) for v in pattern.values()])
    targets = getattr(peft, "target_modules", None)
    modules = len(targets) if isinstance(targets, (list, tuple, set, frozenset)) else 7
    # Weights, gradients and two Adam moments, fp32: 16 bytes a parameter.
    adapter = rank * modules * layers * (hidden + max(hidden, shape.intermediate_size)) * 16
    checkpointing = bool(values.get("gradient_checkpointing") or values.get(
        "activation_checkpointing"))
    kept_layers = 1 + layers * 4 / _ACTIVATION_BYTES if checkpointing else layers
    activations = batch * length * (hidden * kept_layers * _ACTIVATION_BYTES
                                    + shape.vocab_size * 8)
    generated = max(_count(v) for _, v in generation_lengths(values))
    generation = 0.0
    if generated:
        prompt = max(_count(values.get("max_prompt_length")), length - generated, 0)
        generation = batch * (2 * layers * (prompt + generated) * hidden * 4
                              + shape.vocab_size * 4)
    return Estimate(*(int(min(x, 1 << 62)) for x in (adapter, activations, generation, loader)))


def clone_values(parent: Mapping[str, Any], out: Mapping[str, Any]) -> dict[str, Any]:
    """A clone's values: its parent's with the op's resolved overrides ``out`` (a knob of its
    own inside a config object, ``peft_config.r``, set on a copy of the object)."""
    values = dict(parent)
    for key, value in out.items():
        head, _, attr = key.partition(".")
        if not attr:
            values[key] = value
            continue
        base = values.get(head)
        if dataclasses.is_dataclass(base) and not isinstance(base, type):
            try:
                values[head] = dataclasses.replace(base, **{attr: value})
            except Exception:  # noqa: BLE001 - the build says what is wrong with it
                continue
    return values


def _caps(values: Mapping[str, Any], shape: ModelShape | None) -> dict[str, tuple[float, str]]:
    """The hard caps of this machine and model, by the key they bound."""
    cpus = os.cpu_count() or 1
    caps: dict[str, tuple[float, str]] = {
        "dataloader_num_workers": (cpus, f"this machine's {cpus} CPUs (a worker is a process)"),
        "dataloader_prefetch_factor": (
            MAX_PREFETCH_FACTOR, f"MAX_PREFETCH_FACTOR={MAX_PREFETCH_FACTOR} (in "
            "trl_rapidfire.control.clone_resources): each worker loads this many batches ahead"),
    }
    context = shape.context if shape is not None and shape.context else None
    limit = min(MAX_GENERATION_TOKENS, context) if context else MAX_GENERATION_TOKENS
    source = (f"the model's context window of {context:,} tokens"
              if context and context <= MAX_GENERATION_TOKENS else
              f"MAX_GENERATION_TOKENS={MAX_GENERATION_TOKENS:,} (in "
              "trl_rapidfire.control.clone_resources)")
    for key, _ in generation_lengths(values):
        caps[key] = (limit, f"{source}: every step of generation waits for the longest answer")
    return caps


def resource_problems(parent: Mapping[str, Any], clone: Mapping[str, Any],
                      changed: Mapping[str, tuple[str, Any]], shape: ModelShape | None,
                      free_bytes: int | None) -> list[ResourceProblem]:
    """What of a clone is past this machine: its values ``clone`` against its parent's
    ``parent``; ``changed``: the op's keys and values, by the top-level name they change.
    Only a value the clone changes is blamed (and only a clone that needs more memory than
    its parent); the memory estimate blames the changed name that grows it most."""
    problems = []
    for key, (limit, says) in _caps(clone, shape).items():
        head, _, inner = key.partition(".")
        if head not in changed:
            continue
        value = _inner(clone.get(head), inner) if inner else clone.get(head)
        if _count(value) > limit:
            problems.append(ResourceProblem(key, value, f"{limit:,.0f}", says))
    if free_bytes is None or not changed:
        return problems
    budget = free_bytes * MEMORY_SHARE
    before, after = estimate(parent, shape), estimate(clone, shape)
    # The parent's footprint has been shown to fit, and runs take turns: what the clone adds
    # is its own adapter and optimizer states (kept while it lives) and its growth over the
    # parent's transient memory (activations, generation, loading).
    need = after.adapter + max(0, after.total - before.total)
    if need <= budget or after.total <= before.total:
        return problems
    growth = {name: estimate({**parent, name: clone.get(name)}, shape).total
              for name in changed}
    name = max(growth, key=lambda n: growth[n])
    shown_key, shown_value = changed[name]
    problems.append(ResourceProblem(
        shown_key, shown_value, f"{_gib(budget)} ({MEMORY_SHARE:.0%} of the {_gib(free_bytes)} "
        "this machine has free)", f"the clone is estimated to add {_gib(need)} (it needs "
        f"{_gib(after.total)}: {after.parts()}; its parent {_gib(before.total)})"))
    return problems
