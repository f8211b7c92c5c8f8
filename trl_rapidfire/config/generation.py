"""The generation config of a run judged by what it generates (``generation_config``), read
from what a user may write: a ``transformers.GenerationConfig``, a mapping of its fields, or
their JSON (a YAML config or the command line), and checked before anything trains."""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig

from ..storage.outside_text import OutsideTextError, loads
from .errors import RFConfigError
from .knobs import List, is_knob

__all__ = ["GenerationEvalFields", "check_generation_fields", "generation_config_from"]

# A generation config's JSON is small: a few dozen fields.
_MAX_JSON_BYTES = 64 * 1024


@functools.cache
def _known_fields() -> frozenset[str]:
    return frozenset(GenerationConfig().to_dict())


def generation_config_from(value: Any, name: str) -> GenerationConfig:
    """``value`` as a ``GenerationConfig`` (a copy), or :class:`RFConfigError` naming the field
    ``name`` and the fix: an unknown field (with the nearest known name), no
    ``max_new_tokens`` (each evaluation would generate up to the model's length), or what
    ``GenerationConfig.validate`` refuses."""
    example = f"{name}=GenerationConfig(max_new_tokens=32, do_sample=False)"
    if isinstance(value, str):
        try:
            value = loads(value, what=f"`{name}`", max_bytes=_MAX_JSON_BYTES)
        except OutsideTextError as err:
            raise RFConfigError(f"{err}. Use e.g. {example}.") from None
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in _known_fields())
        if unknown:
            near = difflib.get_close_matches(unknown[0], sorted(_known_fields()), n=1)
            hint = f" (did you mean `{near[0]}`?)" if near else ""
            raise RFConfigError(f"`{name}` has no field `{unknown[0]}`{hint}; it takes the "
                                f"fields of transformers.GenerationConfig, e.g. {example}.")
        try:
            value = GenerationConfig(**dict(value))
        except (TypeError, ValueError) as err:
            raise RFConfigError(f"`{name}`: {err}") from None
    if not isinstance(value, GenerationConfig):
        raise RFConfigError(f"`{name}` takes a transformers.GenerationConfig or a dict of its "
                            f"fields, got {type(value).__name__}. Use e.g. {example}.")
    if value.max_new_tokens is None:
        raise RFConfigError(f"`{name}` needs max_new_tokens: every evaluation generates for "
                            f"each eval row, so bound its answers. Use e.g. {example}.")
    try:
        value.validate()
    except ValueError as err:
        raise RFConfigError(f"`{name}`: {err}") from None
    return copy.deepcopy(value)


@dataclass
class GenerationEvalFields:
    """The fields of RF configs whose runs may be judged by what they generate (SFT, DPO)."""

    generation_config: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Judge each run by what it generates: at every evaluation the run answers "
            "the eval set's prompts with this transformers.GenerationConfig (or a dict of its "
            "fields; max_new_tokens is required), and the trainer's compute_metrics scores the "
            "decoded answers against the references (EvalPrediction(predictions=[answer, ...], "
            "label_ids=[reference, ...])); without compute_metrics, exact match. Logged as "
            "eval_<name>. May be a knob."
        },
    )
    generation_eval_rows: int | None = field(
        default=None,
        metadata={"help": "Generate for the first this many rows of each eval set (default: all "
                  "of them); the loss is still evaluated on every row."},
    )
    generation_saved_rows: int = field(
        default=8,
        metadata={"help": "How many (prompt, answer, reference) rows of each generation eval "
                  "are written to <run dir>/generations/<eval>-step-<N>.jsonl (0: none)."},
    )


def check_generation_fields(raw: Mapping[str, Any]) -> None:
    """:class:`RFConfigError` for a generation field set wrongly (every candidate of a knob)."""
    config = raw.get("generation_config")
    for value in config.values if isinstance(config, List) else [config]:
        if value is not None:
            generation_config_from(value, "generation_config")
    for name, least in (("generation_eval_rows", 1), ("generation_saved_rows", 0)):
        if name not in raw:  # a config without these fields (GRPO)
            continue
        value = raw[name]
        candidates = value.values if isinstance(value, List) else [value]
        for v in candidates:
            if is_knob(v) or (v is None and name == "generation_eval_rows"):
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise RFConfigError(f"`{name}` must be an integer >= {least}, got {v!r}. Use "
                                    f"e.g. {name}={max(least, 8)}.")
