"""The one table of the fields trl-rapidfire adds to TRL's configs, and of the fields that
describe the experiment rather than one run.

Every rule about these fields reads this table: the RF configs take the RF-only ones out
before a run's TRL config is built and refuse a knob on an experiment-wide one, and a clone op
refuses to change what a clone keeps.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from typing import Any

__all__ = ["CHUNK", "CLONE_KEEPS", "ENGINE_EVALS", "EXPERIMENT_WIDE", "GENERATION_FIELDS",
           "POLICY", "RF_ONLY", "STOP_DIVERGED_ATTR", "admits", "allowed_values", "field_types",
           "numeric_field", "type_members"]

GENERATION_FIELDS = ("generation_config", "generation_eval_rows", "generation_saved_rows")
"""The fields of a run judged by what it generates (SFT and DPO configs; see
:mod:`trl_rapidfire.trainers.generation_eval`)."""

CHUNK = "chunk"
"""The trl-rapidfire value of ``eval_strategy``/``save_strategy``: act at every chunk end."""

POLICY = "policy"
"""The trl-rapidfire value of ``eval_strategy`` that evaluates a run only where the
experiment's policy reads its metric (SuccessiveHalving's rungs, PopulationBased's exploit
points, ...) and at the run's last chunk."""

ENGINE_EVALS = (CHUNK, POLICY)
"""The ``eval_strategy`` values the engine carries out itself (TRL is given ``"no"``)."""

RF_ONLY = frozenset({"num_chunks", "warmup_ratio", "cache_budget_bytes", "clone_overrides",
                     "checkpoint_every", "stop_diverged", *GENERATION_FIELDS})
"""Fields of the RF configs that TRL's configs do not have (``warmup_ratio``: transformers 5
removed it; the RF configs still read it, see :mod:`.removed_options`)."""

EXPERIMENT_WIDE = frozenset({"output_dir", "num_chunks", "cache_budget_bytes", "clone_overrides",
                             "checkpoint_every", "stop_diverged"})
"""Fields that describe the whole experiment: one value for every run (never a knob), and no
clone may change them (one folder, one chunk plan, one cache, one cadence)."""

STOP_DIVERGED_ATTR = "rf_stop_diverged"
"""The attribute of a run's TRL config that carries the RF config's ``stop_diverged`` (an
RF-only field, so not a field of the TRL config) to the engine's divergence check; a plain TRL
config has none: ``None``, the default."""

CLONE_KEEPS = EXPERIMENT_WIDE | {"report_to"}
"""Fields a clone keeps from the experiment: the experiment-wide ones, and ``report_to`` (a
knob may give runs different integrations, but a clone's metrics go where its parent's do: the
experiment's tracker)."""


# A name in TRL's help text: 'adamw_torch' or `adamw_torch` (read by allowed_values).
_QUOTED = re.compile(r"`?'([A-Za-z0-9_]+)'`?|`([A-Za-z0-9_]+)`")


@functools.cache
def allowed_values(config_class: type, field_name: str) -> frozenset[str] | None:
    """The names TRL accepts for ``field_name``, or None if they cannot be read reliably."""
    assert dataclasses.is_dataclass(config_class)  # TRL's configs are dataclasses
    fld = config_class.__dataclass_fields__.get(field_name)
    if fld is None:
        return None
    if fld.metadata.get("choices"):
        return frozenset(str(c) for c in fld.metadata["choices"])
    help_text = " ".join(fld.metadata.get("help", "").split())
    match = re.search(r"(?:Possible|Supported) values are:?(.*?)(?:\.\s|\.$|$)", help_text)
    if not match:
        return None
    names = {a or b for a, b in _QUOTED.findall(match.group(1))}
    default = fld.default if fld.default is not dataclasses.MISSING else None
    if fld.default_factory is not dataclasses.MISSING:
        produced = fld.default_factory()
        default = produced[0] if isinstance(produced, list) and produced else produced
    # The list must at least contain the default, or the text was not what we think it is.
    if len(names) < 2 or (isinstance(default, str) and default not in names):
        return None
    return frozenset(names)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The type annotations of ``cls``'s fields, resolved (read once per class)."""
    return typing.get_type_hints(cls)


def type_members(tp: Any) -> tuple[Any, ...]:
    """The members of a union annotation (``X | None``, ``Union[X, Y]``), else ``(tp,)``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def admits(tp: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a field annotated ``tp`` may legitimately hold a value of one of ``kinds``."""
    for member in type_members(tp):
        if member is typing.Any:
            return True
        origin = typing.get_origin(member) or member
        if isinstance(origin, type) and issubclass(origin, kinds):
            return True
    return False


def numeric_field(tp: Any) -> bool:
    """Whether a Range may set a field annotated ``tp`` (numbers, but not flags: bool is an int)."""
    return any(
        isinstance(m, type) and issubclass(m, (int, float)) and m is not bool
        for m in type_members(tp)
    ) or typing.Any in type_members(tp)
