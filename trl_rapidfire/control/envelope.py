"""The envelope of what a clone asked from outside (a run tag, an op file in the inbox, the CLI,
a panel) may set: what the experiment itself declared, a factor around it, and a short list of
fields that cost nothing whatever their value.

The rule, for a field the author did not list in ``clone_overrides``:

* A number is held to the field's *span*: the lowest and highest numbers the experiment
  declared for it (a knob's candidates or a ``Range``'s bounds, and the parent run's own
  value; for a field that is no knob, the parent's value alone). A clone may ask for
  anything from ``low / SPAN_FACTOR`` to ``high * SPAN_FACTOR``. A number inside a mapping is
  held to the span of the same key; inside a list, to the span of the list's numbers.
* A field the experiment declared no number for (``None``, ``"auto"``) takes no number from
  outside; ``None`` where the experiment declared numbers lifts a bound and is refused too.
* The fields of :data:`SAFE_FIELDS` are pure optimisation settings: they size no memory, no
  time, no process; any value their config accepts may be asked (some within a small bound).
* Text, bools and module names stay under :mod:`trl_rapidfire.control.trust`'s rules.

No field is known by its trainer kind: a new trainer's fields fall under the same rule. The
resource estimate that comes on top (widened fields included) is
:mod:`trl_rapidfire.control.clone_resources`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.knobs import List, Range
from ..storage.names import UntrustedValue

__all__ = ["SAFE_FIELDS", "SPAN_ALIASES", "SPAN_FACTOR", "Declared", "Span", "check_envelope",
           "declared_for"]

SPAN_FACTOR = 4
"""How far around its declared span a clone from outside may take a number (both ways)."""

SAFE_FIELDS: dict[str, tuple[float, float] | None] = {
    # Optimisation hyperparameters: a bad value makes one run learn badly, nothing more.
    **dict.fromkeys(("learning_rate", "weight_decay", "adam_beta1", "adam_beta2",
                     "adam_epsilon", "max_grad_norm", "lr_scheduler_type",
                     "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps", "seed", "data_seed",
                     "label_smoothing_factor", "optim_target_modules", "neftune_noise_alpha",
                     "gradient_checkpointing", "activation_checkpointing"), None),
    # Method coefficients of TRL's trainers (a loss's weights, not a size).
    **dict.fromkeys(("beta", "loss_type", "rpo_alpha", "label_smoothing", "epsilon",
                     "epsilon_high", "scale_rewards", "reward_weights", "alpha",
                     "completion_only_loss", "assistant_only_loss"), None),
    # LoRA's scale and dropout (its rank sizes the adapter: not here).
    **dict.fromkeys(("lora_alpha", "lora_dropout", "use_rslora", "bias"), None),
    # Padding to a multiple of a small number (tensor cores want 8 or 64).
    "pad_to_multiple_of": (1, 128),
}
"""Fields (by their own name, the part after the last dot) a clone from outside may set
without a span: ``None`` for any value the field's config accepts, or ``(low, high)``."""

SPAN_ALIASES: dict[str, str] = {"rank_pattern": "r", "alpha_pattern": "lora_alpha"}
"""A field whose numbers are another field's, per module: held to that field's span."""


@dataclass(frozen=True)
class Declared:
    """What the experiment declared for one override's key.

    Attributes:
        values: the knob's candidates (a ``Range``: its bounds) and the parent run's value.
        knob: whether the key (or the knob it is a field of) is one of the experiment's knobs.
        alias_values: the same for the field :data:`SPAN_ALIASES` names, if any.
    """

    values: tuple[Any, ...]
    knob: bool
    alias_values: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Span:
    """The lowest and highest number declared for a field, and how far a clone may go."""

    low: float
    high: float
    integer: bool

    def reach(self) -> tuple[float, float]:
        """The interval a clone from outside may ask for: a factor around the span."""
        low = self.low * SPAN_FACTOR if self.low < 0 else self.low / SPAN_FACTOR
        high = self.high / SPAN_FACTOR if self.high < 0 else self.high * SPAN_FACTOR
        if self.integer:
            return float(math.floor(low)), float(math.ceil(high))
        return low, high


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _spec_values(spec: Any, attr: str) -> list[Any]:
    """The numbers (or values) a knob declared: a ``Range``'s bounds, a ``List``'s candidates
    (their field ``attr`` for candidates that are config objects)."""
    if isinstance(spec, Range):
        return [spec.low, spec.high]
    if isinstance(spec, List):
        return [getattr(c, attr, None) if attr else c for c in spec.values]
    return []


def declared_for(key: str, knob_specs: Mapping[str, Any], parent: Any) -> Declared:
    """What the experiment declared for ``key`` (``name`` or ``name.field``).

    Args:
        key: the override's key.
        knob_specs: the experiment's knobs as declared (``List``/``Range``), by name (a knob
            of its own inside a config object by its dotted name).
        parent: the parent run's value of ``key``'s head (its config object for a dotted key).
    """
    name, _, attr = key.partition(".")

    def one(field_name: str) -> Declared:
        value = getattr(parent, field_name, None) if field_name else parent
        if f"{name}.{field_name}" in knob_specs:
            return Declared((*_spec_values(knob_specs[f"{name}.{field_name}"], ""), value), True)
        spec = knob_specs.get(name)
        return Declared((*_spec_values(spec, field_name), value), spec is not None)

    found = one(attr)
    alias = SPAN_ALIASES.get(attr)
    if alias is None:
        return found
    return Declared(found.values, found.knob, one(alias).values)


def _leaves(value: Any) -> Iterator[tuple[str | None, Any]]:
    """``value``'s leaves, each with its key in a mapping (``None`` outside one)."""
    if isinstance(value, Mapping):
        for k, item in value.items():
            yield str(k), item
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield None, item
    else:
        yield None, value


def _span(values: Sequence[Any], key: str | None) -> Span | None:
    numbers = [leaf for v in values for k, leaf in _leaves(v)
               if _number(leaf) and (key is None or k == key) and math.isfinite(leaf)]
    if not numbers:
        return None
    return Span(min(numbers), max(numbers), all(isinstance(n, int) for n in numbers))


def _shown(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _widen(key: str) -> str:
    return (f"The script's author can let tags, op files and panels go further with "
            f"clone_overrides=[{key!r}] in the config (the clone's resource estimate still "
            "applies), or clone from the script (trainer.clone)")


def _check_safe(key: str, field_name: str, value: Any) -> None:
    bound = SAFE_FIELDS[field_name]
    if bound is None:
        return
    low, high = bound
    for _, leaf in _leaves(value):
        if _number(leaf) and not (low <= leaf <= high):
            raise UntrustedValue(
                f"`{key}`={_shown(leaf)} is outside what a clone from outside may ask for this "
                f"field: {low:g} to {high:g}. {_widen(key)}")


def check_envelope(key: str, value: Any, declared: Declared, *,
                   allowed: Collection[str] = ()) -> None:
    """Raise :class:`UntrustedValue` unless a clone from outside may set ``key`` to ``value``
    (see the module's rule); the message names the field, the value, the limit and how the
    script's author widens it."""
    name = key.partition(".")[0]
    if key in allowed or name in allowed:
        return
    field_name = key.rpartition(".")[2]
    if field_name in SAFE_FIELDS:
        _check_safe(key, field_name, value)
        return
    declared_values = declared.values
    where = "its candidates and the parent run's value" if declared.knob else (
        "the parent run's value; it is no knob")
    if value is None:
        if _span(declared_values, None) is not None and all(
                v is not None for v in declared_values):
            raise UntrustedValue(f"`{key}`=None lifts the bound the experiment declared for it "
                                 f"({where}). {_widen(key)}")
        return
    in_mapping = isinstance(value, Mapping)
    for sub, leaf in _leaves(value):
        if not _number(leaf):
            continue
        shown_key = f"{key}[{sub!r}]" if sub is not None else key
        span = _span(declared_values, sub if in_mapping else None)
        if span is None and declared.alias_values:
            span = _span(declared.alias_values, None)
        if span is None:
            raise UntrustedValue(
                f"`{shown_key}`={_shown(leaf)}: the experiment declared no number for it "
                f"({where}: none), so a clone from outside cannot set one. "
                f"{_widen(key)}")
        low, high = span.reach()
        if not (math.isfinite(leaf) and low <= leaf <= high):
            declared_text = (f"{_shown(span.low)}" if span.low == span.high
                             else f"{_shown(span.low)} to {_shown(span.high)}")
            raise UntrustedValue(
                f"`{shown_key}`={_shown(leaf)} is outside what a clone from outside may ask: "
                f"the experiment declared {declared_text} ({where}), and a clone may go a "
                f"factor of {SPAN_FACTOR} around it, from {_shown(low)} to {_shown(high)}. "
                f"{_widen(key)}")
