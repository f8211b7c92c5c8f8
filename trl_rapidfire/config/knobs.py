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
    "LORA_SHORT_NAMES",
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
            and all(same_value(a, b) for a, b in zip(self._values, other.values))
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


class _UnsetDtype:
    """The default ``dtype`` of a Range: ``float``, except on a field typed as an integer
    (batch sizes, step counts), where an RF config draws integers."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "float"


_UNSET_DTYPE: Any = _UnsetDtype()


class Range(Knob):
    """A numeric interval for one knob, sampled by :class:`~trl_rapidfire.RandomSearch`.

    Args:
        low: lower bound (inclusive).
        high: upper bound (exclusive for floats, inclusive for ``dtype=int``).
        log: sample log-uniformly (for learning rates and other scale parameters); needs
            ``low > 0``.
        dtype: ``float`` or ``int``. Left unset it is ``float``, but a Range set on a config
            field typed as an integer (``per_device_train_batch_size``, ``max_steps``, ...)
            draws integers, as with ``dtype=int``.

    Raises:
        KnobError: for non-numeric bounds, ``low >= high``, ``log=True`` with ``low <= 0``, an
            unknown ``dtype``, or non-integer bounds with ``dtype=int``.
    """

    __slots__ = ("low", "high", "log", "dtype", "_dtype_given")

    def __init__(self, low: float, high: float, *, log: bool = False,
                 dtype: type = _UNSET_DTYPE):
        dtype_given = dtype is not _UNSET_DTYPE
        if not dtype_given:
            dtype = float
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
        self._dtype_given = dtype_given

    @property
    def dtype_given(self) -> bool:
        """Whether ``dtype`` was written out (``Range(2, 8, dtype=float)``) or left unset."""
        try:
            return self._dtype_given
        except AttributeError:  # a Range pickled before this slot existed
            return True

    def for_integer_field(self, name: str) -> Range:
        """This Range drawing integers, for the integer field ``name``: a float batch size or
        step count would only fail once its run trains.

        Raises:
            KnobError: ``dtype=float`` was written out, or a bound is not a whole number.
        """
        if self.dtype is int:
            return self
        low, high = math.floor(self.low), math.ceil(self.high)
        fix = (f"Write Range({low}, {high}, dtype=int) (YAML: {name}: {{Range: {{low: {low}, "
               f"high: {high}, dtype: int}}}})")
        if self.dtype_given:
            raise KnobError(f"`{name}` takes an integer, but Range({self.low!r}, {self.high!r}, "
                            f"dtype=float) draws floats. {fix}, or leave dtype out.")
        if low != self.low or high != self.high:
            raise KnobError(f"`{name}` takes an integer, so its Range draws integers and needs "
                            f"whole-number bounds, got {self!r}. {fix}.")
        return Range(low, high, log=self.log, dtype=int)

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
    if type(value).__name__ == "GenerationConfig":  # by its fields, as a YAML config writes it
        return {k: _jsonable(v) for k, v in value.to_diff_dict().items()
                if k != "transformers_version"}
    return repr(value)


_KNOB_KINDS = ("List", "Range")


def _near_miss(key: Any) -> bool:
    """``list``, ``Lst``, ``RANGE``, ``Ranges``: a key one slip away from ``List``/``Range``."""
    if not isinstance(key, str) or key in _KNOB_KINDS:
        return False
    word = key.casefold()
    return any(_one_edit_apart(word, kind.casefold()) for kind in _KNOB_KINDS)


def _one_edit_apart(a: str, b: str) -> bool:
    """Equal, or one insertion, deletion, substitution or swap of neighbours apart."""
    if a == b:
        return True
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (
            len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
            and a[diff[1]] == b[diff[0]]
        )
    if abs(len(a) - len(b)) != 1:
        return False
    short, long_ = sorted((a, b), key=len)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _yaml_form(field: str | None, kind: str, spec: Any) -> str:
    name = field or "<field>"
    if kind == "Range" or spec is None:
        return f"{name}: {{Range: {{low: 1.0e-5, high: 1.0e-3, log: true}}}}"
    shown = ", ".join(str(_jsonable(v)) for v in spec) if isinstance(spec, (list, tuple)) else ""
    return f"{name}: {{List: [{shown or '1.0e-4, 3.0e-4'}]}}"


def knob_from_json(value: Any, field: str | None = None) -> Knob | None:
    """Read a knob written as JSON/YAML: ``{"List": [...]}`` or ``{"Range": {"low": .., ...}}``.

    Returns None when ``value`` is not such a mapping, so callers can pass any value through.
    This is how YAML configs (``learning_rate: {List: [1.0e-4, 3.0e-4]}``) express knobs; it
    never evaluates text.

    Args:
        value: the field's value as read from YAML/JSON.
        field: the field's name, for the messages.

    Raises:
        KnobError: a ``List``/``Range`` key next to other keys, a key one slip away from
            ``List``/``Range`` (``list``, ``Lst``, ``range``), or a bad spec.
    """
    if not isinstance(value, dict):
        return None
    where = f"`{field}`: " if field else ""
    kinds = [k for k in value if k in _KNOB_KINDS]
    if kinds and len(value) > 1:
        others = [k for k in value if k != kinds[0]]
        example = _yaml_form(field, kinds[0], value[kinds[0]])
        raise KnobError(
            f"{where}a {kinds[0]} knob must be the only key of its mapping, got the extra "
            f"key(s) {others!r}. Write it alone, e.g. {example}."
        )
    if not kinds:
        for key, spec in value.items():
            # Only a key holding what a knob would (a list, a Range spec) is taken for a slip:
            # fields that take mappings have keys like "last_epoch": 5.
            if _near_miss(key) and isinstance(spec, (list, tuple, dict)):
                kind = "Range" if key.casefold().startswith("r") else "List"
                raise KnobError(
                    f"{where}the key {key!r} is not a knob: knobs are written with the key "
                    f"{kind!r} exactly (capitalised). Write "
                    f"{_yaml_form(field, kind, spec if kind == 'List' else None)} in YAML, or "
                    f"{field or '<field>'}={kind}(...) in Python."
                )
        return None
    try:
        return _knob_from_spec(*next(iter(value.items())), field)
    except KnobError as err:
        if where and not str(err).startswith(where):
            raise KnobError(f"{where}{err}") from None
        raise


def _knob_from_spec(kind: str, spec: Any, field: str | None) -> Knob:
    if kind == "List":
        try:
            return List(spec)
        except KnobError as err:
            raise KnobError(f"{err} In YAML: {_yaml_form(field, 'List', None)}.") from None
    if isinstance(spec, dict):
        given, spec = sorted(spec), dict(spec)
        dtype = spec.pop("dtype", None)
        if dtype not in (None, "int", "float"):
            raise KnobError(f'Range "dtype" must be "int" or "float", got {dtype!r}.')
        unknown = set(spec) - {"low", "high", "log"}
        if unknown or not {"low", "high"} <= set(spec):
            raise KnobError(
                f"Range spec needs keys low, high (and optionally log, dtype); "
                f"got {given}. "
                f"In YAML: {_yaml_form(field, 'Range', None)}."
            )
        kwargs: dict[str, Any] = {"log": spec.get("log", False)}
        if dtype is not None:
            kwargs["dtype"] = int if dtype == "int" else float
        return _yaml_range(field, spec["low"], spec["high"], **kwargs)
    if isinstance(spec, (list, tuple)) and len(spec) == 2:
        return _yaml_range(field, spec[0], spec[1])
    raise KnobError(
        f"Range spec must be {{low: .., high: ..}} or [low, high], got {spec!r}. "
        f"In YAML: {_yaml_form(field, 'Range', None)}."
    )


def _yaml_range(field: str | None, low: Any, high: Any, **kwargs: Any) -> Range:
    """``Range(low, high, ...)`` read from YAML: an error says how YAML writes one."""
    try:
        return Range(low, high, **kwargs)
    except KnobError as err:
        raise KnobError(f"{err} In YAML: {_yaml_form(field, 'Range', None)}.") from None


# The short names a LoraConfig's description gives two of its fields (views that read the
# description back into fields map them back: reports/knob_fields.py).
LORA_SHORT_NAMES = {"lora_alpha": "alpha", "target_modules": "targets"}
# A LoraConfig's fields that its description never shows: the three it always shows, and
# what a config carries without a person choosing it (PEFT fills them in).
_LORA_SHOWN = frozenset({"r", "lora_alpha", "target_modules", "task_type", "peft_type",
                         "base_model_name_or_path", "revision", "inference_mode",
                         "auto_mapping", "runtime_config"})
_LORA_DEFAULTS: dict[type, Any] = {}


def _lora_extras(value: Any) -> list[tuple[str, Any]]:
    """The fields of a LoraConfig (a dataclass) set to something other than their default,
    besides rank, alpha and targets: two configs that differ only in ``lora_dropout`` must not
    be described alike (tables, MLflow params and the shared state show the description)."""
    import dataclasses

    if not dataclasses.is_dataclass(value):
        return []
    cls: Any = type(value)
    if cls not in _LORA_DEFAULTS:
        try:
            _LORA_DEFAULTS[cls] = cls()
        except Exception:  # noqa: BLE001 - no default instance: nothing to compare with
            _LORA_DEFAULTS[cls] = None
    default = _LORA_DEFAULTS[cls]
    if default is None:
        return []
    out = []
    for f in dataclasses.fields(value):
        if f.name in _LORA_SHOWN:
            continue
        mine, theirs = getattr(value, f.name, None), getattr(default, f.name, None)
        try:
            differs = bool(mine != theirs)
        except Exception:  # noqa: BLE001 - a value that cannot say: left out
            continue
        if differs:
            out.append((f.name, mine))
    return out


def describe_value(value: Any) -> str:
    """A short human form of a knob value: functions by name, LoRA configs by rank, alpha and
    targets, generation configs by the fields set, everything else by ``repr``."""
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe_value(v) for v in value)
        return f"[{inner}]"
    if type(value).__name__ == "LoraConfig":
        targets = value.target_modules
        if targets and not isinstance(targets, str):  # a string is a name or a pattern
            targets = sorted(targets)
        extra = "".join(f", {name}={field!r}" for name, field in _lora_extras(value))
        alpha, shown = LORA_SHORT_NAMES["lora_alpha"], LORA_SHORT_NAMES["target_modules"]
        return (f"LoraConfig(r={value.r}, {alpha}={value.lora_alpha}, {shown}={targets!r}"
                f"{extra})")
    if type(value).__name__ == "GenerationConfig":
        fields = {k: v for k, v in value.to_diff_dict().items() if k != "transformers_version"}
        return "GenerationConfig(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"
    return repr(value)
