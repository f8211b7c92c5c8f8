"""Knobs inside a config object given as a trainer argument:
``peft_config=LoraConfig(r=List([8, 16]), target_modules=List([["q_proj"], ["v_proj"]]))``.

Each such field is a knob of its own, named by its dotted path (``peft_config.r``): an axis of
the grid, a dimension of a random or Optuna search, a column of the runs table, a parameter in
MLflow. A run's object is built by the object's own class from the fields as written with the
run's values put in (its ``__post_init__`` runs again on concrete values), so each run gets
exactly the object a plain script would pass. A clone changes one field by the same dotted
name (``peft_config.r=32``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from ..config.fields import field_types
from ..config.knobs import Knob, KnobError, Range
from ..config.preflight import scalar_kind

__all__ = ["build_objects", "inner_knobs", "is_config_object", "knob_fields", "with_fields"]


def is_config_object(value: Any) -> bool:
    """Whether ``value`` is a config object whose fields may hold knobs (a dataclass instance,
    as PEFT's configs are)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def knob_fields(value: Any) -> dict[str, Knob]:
    """The fields of the config object ``value`` that hold a knob, in field order (``{}`` for
    anything else)."""
    if not is_config_object(value):
        return {}
    return {f.name: inner for f in dataclasses.fields(value)
            if isinstance(inner := getattr(value, f.name, None), Knob)}


def inner_knobs(name: str, value: Any) -> dict[str, Knob]:
    """The knobs inside ``value`` (the trainer argument ``name``), by dotted name, in field
    order; ``{}`` when it holds none. A ``Range`` on an integer field (``r``, ``lora_alpha``)
    draws integers; a ``Range`` on a field that is not a number is an error."""
    found = knob_fields(value)
    if not found:
        return {}
    owner: type = type(value)  # typed `type`: see configs._collect_knobs (python/mypy#11470)
    try:
        hints = field_types(owner)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: nothing known
        hints = {}
    out: dict[str, Knob] = {}
    for field_name, knob in found.items():
        key = f"{name}.{field_name}"
        if isinstance(knob, Range):
            kind = scalar_kind(hints.get(field_name))
            if kind in ("int", "int_or_str"):
                knob = knob.for_integer_field(key)
            elif kind != "float":
                raise KnobError(
                    f"`{key}`={knob!r}: a Range draws numbers, and {type(value).__name__}."
                    f"{field_name} is not a number. Give its candidates: {key}=List([...]).")
        out[key] = knob
    return out


def with_fields(obj: Any, values: Mapping[str, Any]) -> Any:
    """A new ``obj`` with the fields ``values`` set, made by its own class (so its validation
    runs on the concrete values); ``obj`` itself is left as it is."""
    kwargs = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
    unknown = sorted(set(values) - set(kwargs))
    if unknown:
        raise KnobError(f"{type(obj).__name__} has no field {unknown[0]!r}")
    kwargs.update(values)
    return type(obj)(**copy.deepcopy(kwargs))


def build_objects(knobs: Mapping[str, Any], trainer_level: Mapping[str, Any]) -> dict[str, Any]:
    """The config objects a run's dotted knobs choose: trainer argument -> its object, built
    from the argument as given (a config with knobs in it, or a parent run's object) with the
    run's values put in. Dotted knobs of other names are not this function's."""
    chosen: dict[str, dict[str, Any]] = {}
    for key, value in knobs.items():
        head, dot, attr = key.partition(".")
        if dot and is_config_object(trainer_level.get(head)):
            chosen.setdefault(head, {})[attr] = value
    return {head: with_fields(trainer_level[head], values) for head, values in chosen.items()}
