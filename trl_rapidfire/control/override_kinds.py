"""What kind of JSON value an override's field takes: a whole number for a field annotated
``int``, a number where the field held one (or where its annotation takes one, though its
default is text such as ``pad_to_multiple_of="auto"``), a bool where it held a bool, one of a
knob's candidates where JSON cannot spell the value. Split from :mod:`.ops`, which answers
these as the op's error."""

from __future__ import annotations

import functools
import json
import typing
from typing import Any

__all__ = ["OverrideKindError", "checked_kind", "integer_field"]

_JSON_SCALARS = (str, int, float, bool, type(None))


class OverrideKindError(ValueError):
    """An override's value is not of a kind its field takes (the op's error says why)."""


def checked_kind(key: str, value: Any, current: Any, owner: type | None, name: str) -> Any:
    """``value`` as the field ``name`` of the dataclass ``owner`` (``None``: a trainer
    argument, known only by its ``current`` value) takes it, or :class:`OverrideKindError`."""
    if owner is None or not _admits(owner, name, value):
        _check_json_value(key, value, current)
    return value if owner is None else _as_integer(key, value, owner, name)


def _as_integer(key: str, value: Any, owner: type, name: str) -> Any:
    """``value`` for a field annotated ``int``: a whole number (JSON's ``16.0`` becomes
    ``16``); ``1.5`` for a LoRA rank would reach torch as a tensor size and fail there, in a
    message about tensors."""
    if isinstance(value, float) and integer_field(owner, name):
        if not value.is_integer():
            raise OverrideKindError(f"{key!r} takes a whole number, got {value!r}")
        return int(value)
    return value


@functools.cache
def integer_field(owner: type, name: str) -> bool:
    """Whether the dataclass ``owner``'s field ``name`` is annotated as an integer (``int``
    or ``int | None``; not ``int | float``)."""
    try:
        hint = typing.get_type_hints(owner).get(name)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: nothing known
        return False
    kinds = set(typing.get_args(hint)) if typing.get_args(hint) else {hint}
    kinds.discard(type(None))
    return kinds == {int}


@functools.cache
def _annotated_kinds(owner: type, name: str) -> frozenset[type]:
    """The plain types the dataclass ``owner``'s field ``name`` is annotated with (``int | str
    | None``: int, str, NoneType); none when unresolvable."""
    try:
        hint = typing.get_type_hints(owner).get(name)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: nothing known
        return frozenset()
    kinds = typing.get_args(hint) if typing.get_args(hint) else (hint,)
    return frozenset(k for k in kinds if isinstance(k, type))


def _admits(owner: type, name: str, value: Any) -> bool:
    """Whether ``value`` is a number the field's annotation takes, though the current value is
    of another type (``pad_to_multiple_of: int | str | None`` whose default is ``"auto"``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    kinds = _annotated_kinds(owner, name)
    return int in kinds if isinstance(value, int) else float in kinds


def _check_json_value(key: str, value: Any, current: Any) -> None:
    """A JSON value must fit the kind of value it replaces: JSON cannot spell a function or a
    config object (pick a candidate), nor turn a number into text."""
    # A set (LoraConfig keeps target_modules as one) is spelled as a JSON list.
    if not isinstance(current, (*_JSON_SCALARS, list, tuple, dict, set, frozenset)) and (
            value is not None):
        if not isinstance(value, type(current)):
            raise OverrideKindError(
                f"{key!r} holds {type(current).__name__} values, which JSON cannot spell: pick "
                f'one of its candidates, {{"{key}": {{"candidate": 0}}}}, or set one of its '
                "fields with a dotted name")
        return
    if isinstance(current, bool) and not isinstance(value, bool) and value is not None:
        raise OverrideKindError(f"{key!r} takes true or false like {json.dumps(current)}, got "
                                f"{json.dumps(value)}")
    if isinstance(value, bool) and current is not None and not isinstance(current, bool):
        kind = "a number" if isinstance(current, (int, float)) else "a value"
        raise OverrideKindError(f"{key!r} takes {kind} like {current!r}, not true or false")
    if isinstance(current, bool) or isinstance(value, bool):
        return
    if isinstance(current, (int, float)) and not isinstance(value, (int, float)):
        raise OverrideKindError(f"{key!r} takes a number like {current!r}, got {value!r}")
    if isinstance(current, str) and not isinstance(value, str):
        raise OverrideKindError(f"{key!r} takes a string like {current!r}, got {value!r}")
    if isinstance(value, (list, dict)) and isinstance(current, _JSON_SCALARS) and (
        current is not None
    ):
        raise OverrideKindError(f"{key!r} takes a single value like {current!r}, got {value!r}")
