"""Knob specifications: the values a configuration field (or a trainer argument) may take.

A *knob* is any config field or trainer-level argument whose value is not fixed but drawn
from a set of candidates. Two kinds exist:

* :class:`List` -- a finite, ordered set of candidates of any type (numbers, strings,
  ``LoraConfig`` objects, functions, lists of reward functions, ...).
* :class:`Range` -- a numeric interval, only usable with random search.

Knobs are plain, immutable value objects: they know how to validate themselves, how to draw a
value from a ``random.Random`` and how to describe themselves as JSON (for YAML configs,
MLflow params and ``to_dict()``). How knobs combine into runs is the job of ``search.py``.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "Knob",
    "List",
    "Range",
    "KnobError",
    "describe_value",
    "is_knob",
    "knob_from_json",
    "same_value",
]


class KnobError(ValueError):
    """A knob was specified wrongly. The message names the problem and the fix."""


class Knob:
    """Base class of :class:`List` and :class:`Range`."""

    def sample(self, rng: random.Random) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError


def same_value(a: Any, b: Any) -> bool:
    """Equality that tolerates objects whose ``==`` is not a bool (arrays, tensors)."""
    if a is b:
        return True
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


class List(Knob):
    """A finite set of candidate values for one knob.

    ``List([2e-4, 1e-5])`` makes a grid axis of two learning rates; ``List([lora_a, lora_b])``
    compares two LoRA configurations. Candidates may be of any type, including Python lists
    (``List([[f1, f2], [f1]])`` for two sets of reward functions).

    Raises:
        KnobError: if ``values`` is empty or is not a sequence. (A candidate given twice is
            reported by the search, which alone knows whether the List is zipped.)
    """

    __slots__ = ("_values",)

    def __init__(self, values: Sequence[Any]):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise KnobError(
                f"List(...) takes a sequence of candidates, got {type(values).__name__} "
                f"{values!r}. Write e.g. List([1e-4, 3e-4])."
            )
        values = tuple(values)
        if not values:
            raise KnobError(
                "List([]) has no candidates. Give at least one value, e.g. List([1e-4])."
            )
        # Repeated candidates are checked by the search, per axis: a List zipped with another
        # may legitimately repeat a value (one reward set paired with two weightings).
        self._values = values

    @property
    def values(self) -> tuple[Any, ...]:
        """The candidates, in the order given."""
        return self._values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __getitem__(self, i: int) -> Any:
        return self._values[i]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, List)
            and len(other) == len(self)
            and all(same_value(a, b) for a, b in zip(self._values, other._values))
        )

    def __hash__(self) -> int:
        return hash(("List", len(self._values)))

    def __repr__(self) -> str:
        return f"List({list(self._values)!r})"

    def sample_index(self, rng: random.Random) -> int:
        """Draw the index of one candidate, uniformly."""
        return rng.randrange(len(self._values))

    def sample(self, rng: random.Random) -> Any:
        """Draw one candidate uniformly."""
        return self._values[self.sample_index(rng)]

    def to_json(self) -> dict[str, Any]:
        return {"List": [_jsonable(v) for v in self._values]}


class Range(Knob):
    """A numeric interval for one knob, sampled by :class:`~trl_rapidfire.RandomSearch`.

    Args:
        low: lower bound (inclusive).
        high: upper bound (exclusive for floats, inclusive for ``dtype=int``).
        log: sample log-uniformly (for learning rates and other scale parameters); needs
            ``low > 0``.
        dtype: ``float`` (default) or ``int``.

    Raises:
        KnobError: for non-numeric bounds, ``low >= high``, ``log=True`` with ``low <= 0``, an
            unknown ``dtype``, or non-integer bounds with ``dtype=int``.
    """

    __slots__ = ("low", "high", "log", "dtype")

    def __init__(self, low: float, high: float, *, log: bool = False, dtype: type = float):
        for name, bound in (("low", low), ("high", high)):
            if isinstance(bound, bool) or not isinstance(bound, numbers.Real) or math.isnan(bound):
                raise KnobError(
                    f"Range {name} must be a number, got {type(bound).__name__} {bound!r}. "
                    "Write e.g. Range(1e-5, 1e-3, log=True)."
                )
            if math.isinf(bound):
                raise KnobError(f"Range {name} must be finite, got {bound!r}.")
        if not isinstance(log, bool):
            raise KnobError(f"Range log must be True or False, got {log!r}.")
        if dtype not in (int, float):
            raise KnobError(f"Range dtype must be int or float, got {dtype!r}.")
        if dtype is int and (low != int(low) or high != int(high)):
            raise KnobError(
                f"Range(..., dtype=int) needs integer bounds, got low={low!r}, high={high!r}."
            )
        if low >= high:
            raise KnobError(
                f"Range needs low < high, got low={low!r}, high={high!r}. "
                "For a single value write the value itself."
            )
        if log and low <= 0:
            raise KnobError(
                f"Range(..., log=True) samples log-uniformly and needs low > 0, got low={low!r}."
            )
        self.low = float(low) if dtype is float else int(low)
        self.high = float(high) if dtype is float else int(high)
        self.log = bool(log)
        self.dtype = dtype

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Range) and (self.low, self.high, self.log, self.dtype) == (
            other.low,
            other.high,
            other.log,
            other.dtype,
        )

    def __hash__(self) -> int:
        return hash(("Range", self.low, self.high, self.log, self.dtype))

    def __repr__(self) -> str:
        extra = ""
        if self.log:
            extra += ", log=True"
        if self.dtype is int:
            extra += ", dtype=int"
        return f"Range({self.low!r}, {self.high!r}{extra})"

    def sample(self, rng: random.Random) -> float | int:
        """Draw one value: uniform, or log-uniform when ``log=True``."""
        if self.dtype is int:
            if not self.log:
                return rng.randint(int(self.low), int(self.high))
            # Integers in [low, high]: draw in log space over [low, high + 1) and floor, so
            # every integer gets the log-mass of its unit interval.
            x = math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1)))
            # exp(log(x)) can round just below an integer bound: clamp to [low, high].
            return max(int(self.low), min(int(math.floor(x)), int(self.high)))
        if self.log:
            x = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            x = rng.uniform(self.low, self.high)
        # Keep the documented [low, high): rounding can land on or beyond either end.
        return min(max(x, self.low), math.nextafter(self.high, -math.inf))

    def to_json(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.log:
            spec["log"] = True
        if self.dtype is int:
            spec["dtype"] = "int"
        return {"Range": spec}


def is_knob(value: Any) -> bool:
    """True if ``value`` is a :class:`List` or a :class:`Range`."""
    return isinstance(value, Knob)


def _jsonable(value: Any) -> Any:
    """A JSON-friendly stand-in for a candidate (used only for display and logging)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    return repr(value)


def knob_from_json(value: Any) -> Knob | None:
    """Read a knob written as JSON/YAML: ``{"List": [...]}`` or ``{"Range": {"low": .., ...}}``.

    Returns None when ``value`` is not such a mapping, so callers can pass any value through.
    This is how YAML configs (``learning_rate: {List: [1.0e-4, 3.0e-4]}``) express knobs; it
    never evaluates text.
    """
    if not isinstance(value, dict) or len(value) != 1:
        return None
    (kind, spec), = value.items()
    if kind == "List":
        return List(spec)
    if kind == "Range":
        if isinstance(spec, dict):
            spec = dict(spec)
            dtype = spec.pop("dtype", "float")
            if dtype not in ("int", "float"):
                raise KnobError(f'Range "dtype" must be "int" or "float", got {dtype!r}.')
            unknown = set(spec) - {"low", "high", "log"}
            if unknown or not {"low", "high"} <= set(spec):
                raise KnobError(
                    "Range spec needs keys low, high (and optionally log, dtype); "
                    f"got {sorted(value['Range'])}."
                )
            return Range(spec["low"], spec["high"], log=spec.get("log", False),
                         dtype=int if dtype == "int" else float)
        if isinstance(spec, (list, tuple)) and len(spec) == 2:
            return Range(spec[0], spec[1])
        raise KnobError(f"Range spec must be {{low: .., high: ..}} or [low, high], got {spec!r}.")
    return None


def describe_value(value: Any) -> str:
    """A short human form of a knob value: functions by name, LoRA configs by rank, alpha and
    targets, everything else by ``repr``."""
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe_value(v) for v in value)
        return f"[{inner}]"
    if type(value).__name__ == "LoraConfig":
        targets = value.target_modules
        if targets and not isinstance(targets, str):  # a string is a name or a pattern
            targets = sorted(targets)
        return f"LoraConfig(r={value.r}, alpha={value.lora_alpha}, targets={targets!r})"
    return repr(value)
