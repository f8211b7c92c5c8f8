"""Pre-flight checks: what TRL only checks when a trainer is built or at the first step.

TRL accepts, say, ``DPOConfig(loss_type="sigmod")`` and fails minutes later in the first loss
computation. With many runs that means one run dying mid-experiment; here every run's concrete
config (and its trainer-level values) is checked before any training starts.

The accepted names are read from TRL's own field metadata (``choices``) or, where TRL only lists
them in the field's help text, from that text; a field whose list cannot be read is not checked,
so a TRL upgrade can never make a valid value fail here.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["PreflightError", "check_run", "allowed_values"]


class PreflightError(ValueError):
    """A run's values would make TRL fail once training starts."""


# (config class name, field) whose string values TRL checks late or never.
_NAMED_VALUE_FIELDS = {
    "SFTConfig": ("loss_type",),
    "DPOConfig": ("loss_type", "f_divergence_type"),
    "GRPOConfig": ("loss_type", "importance_sampling_level"),
}
_QUOTED = re.compile(r"`?'([A-Za-z0-9_]+)'`?|`([A-Za-z0-9_]+)`")


def _trl_base(config: Any) -> type | None:
    for cls in type(config).__mro__:
        if cls.__name__ in _NAMED_VALUE_FIELDS and cls.__module__.startswith("trl."):
            return cls
    return None


@functools.cache
def allowed_values(config_class: type, field_name: str) -> frozenset[str] | None:
    """The names TRL accepts for ``field_name``, or None if they cannot be read reliably."""
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


def _check_named_values(config: Any) -> None:
    base = _trl_base(config)
    if base is None:
        return
    for name in _NAMED_VALUE_FIELDS[base.__name__]:
        allowed = allowed_values(base, name)
        if allowed is None:
            continue
        value = getattr(config, name)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if str(getattr(item, "value", item)) not in allowed:
                raise PreflightError(
                    f"`{name}`={item!r} is not a {base.__name__} {name}; TRL accepts "
                    f"{sorted(allowed)}."
                )


def _check_reward_weights(config: Any, trainer_kwargs: Mapping[str, Any]) -> None:
    weights = getattr(config, "reward_weights", None)
    if weights is None or "reward_funcs" not in trainer_kwargs:
        return
    funcs = trainer_kwargs["reward_funcs"]
    count = len(funcs) if isinstance(funcs, (list, tuple)) else 1
    if len(weights) != count:
        raise PreflightError(
            f"`reward_weights` has {len(weights)} weight(s) for {count} reward function(s). "
            "Give one weight per function; to vary both together use "
            'GridSearch(zip=[("reward_funcs", "reward_weights")]).'
        )


def check_run(config: Any, trainer_kwargs: Mapping[str, Any]) -> None:
    """Raise :class:`PreflightError` if this run would fail once its trainer is built."""
    _check_named_values(config)
    _check_reward_weights(config, trainer_kwargs)
