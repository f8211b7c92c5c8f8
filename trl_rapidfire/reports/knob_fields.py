"""A knob whose values are config objects, shown by the fields that tell its runs apart.

``peft_config=List([LoraConfig(r=8, lora_alpha=16), LoraConfig(r=8, lora_alpha=32)])`` is one
knob whose two values differ in ``lora_alpha`` alone. A table of runs that shows it as one
column shows a long value cut in the middle, where the difference hides. :func:`expand_knobs`
puts the object's fields in its place as dotted knobs (``peft_config.lora_alpha``), so that the
one rule of "the knobs that differ" (:func:`.display.differing_keys`) makes a column of each
field that differs.

Each view gets such a value in its own form:

* ``RunResult.knobs`` (the trainer's ``runs``, the report): the object itself (a dataclass,
  as PEFT's configs are; a ``GenerationConfig`` by its ``to_diff_dict``).
* The shared state's knobs (``engine/records.py``, the notebook and browser panels) and the
  MLflow params (``trainers/run_builder.py``, ``status`` and the dashboard): the text of
  :func:`..config.knobs.describe_value`, ``LoraConfig(r=8, alpha=16, targets=['q_proj'])``.
  That text is ours and reads as a Python call of literals; it is parsed here (never
  evaluated), bounded in size, and any text that does not read so stays the whole value.
* JSON of either (the browser panel's page): a dict of fields.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..config.knobs import LORA_SHORT_NAMES

__all__ = ["config_fields", "dotted_params", "expand_knobs"]

# Text longer than this is no value we wrote (describe_value's forms are a line or two): it
# stays whole rather than feed a parser megabytes of someone's param.
MAX_TEXT = 4000
MAX_FIELDS = 100  # an object with more is shown whole
# describe_value's short names for a LoraConfig's fields: the field names are the knob names
# (a clone sets ``peft_config.lora_alpha``), so a column has one name in every view.
_SHORT_NAMES = {"LoraConfig": {short: field for field, short in LORA_SHORT_NAMES.items()}}


def _plain(value: Any) -> Any:
    """``value`` in a form that compares and prints the same in every view: sets sorted,
    tuples as lists, enums by their value."""
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=str)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _from_text(text: str) -> dict[str, Any] | None:
    """The fields of ``Name(field=literal, ...)`` text, or ``None`` for any other text."""
    if len(text) > MAX_TEXT or "(" not in text:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, (ast.Name, ast.Attribute))
            and not call.args and call.keywords
            and all(k.arg is not None for k in call.keywords)):
        return None
    owner = call.func.id if isinstance(call.func, ast.Name) else call.func.attr
    names = _SHORT_NAMES.get(owner, {})
    fields: dict[str, Any] = {}
    for keyword in call.keywords:
        try:
            value = _plain(ast.literal_eval(keyword.value))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            # A nested object or a name: its text, as written.
            value = ast.get_source_segment(text.strip(), keyword.value) or ""
        fields[names.get(str(keyword.arg), str(keyword.arg))] = value
    return fields


def config_fields(value: Any) -> dict[str, Any] | None:
    """The fields of the config object ``value`` by name, in field order: a dataclass
    instance, an object with ``to_diff_dict`` (a ``GenerationConfig``: the fields set), a dict
    with text keys, or the text :func:`..config.knobs.describe_value` writes for one. ``None``
    for any other value (a number, a name, text that does not read as an object, an object of
    more than :data:`MAX_FIELDS` fields): it is shown whole."""
    fields: dict[str, Any] | None = None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _plain(getattr(value, f.name, None)) for f in dataclasses.fields(value)}
    elif callable(getattr(value, "to_diff_dict", None)) and not isinstance(value, type):
        try:
            diff = value.to_diff_dict()
        except Exception:  # noqa: BLE001 - someone's object: shown whole
            diff = None
        if isinstance(diff, Mapping):
            fields = {str(k): _plain(v) for k, v in diff.items() if k != "transformers_version"}
    elif isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            fields = {k: _plain(v) for k, v in value.items()}
    elif isinstance(value, str):
        fields = _from_text(value)
    if not fields or len(fields) > MAX_FIELDS:
        return None
    return fields


def _same(values: Sequence[Any]) -> bool:
    """Whether ``values`` are all equal, compared as JSON (as differing_keys does)."""
    try:
        texts = {json.dumps(v, sort_keys=True, default=repr) for v in values}
    except (ValueError, TypeError, RecursionError):  # a cycle, keys of mixed types: unknown
        return False
    return len(texts) < 2


def expand_knobs(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (each run's knobs) with each knob whose values are config objects replaced,
    in its place, by those objects' fields, as dotted knobs
    (``peft_config.lora_alpha``): a table of the knobs that differ then shows each such field
    as a column of its own.

    A knob is expanded only where its objects differ (a knob whose objects are all the same
    stays one value: one column or none). A run whose value is no object (``None`` for a full
    fine-tune beside LoRA runs, or text that does not read as one) keeps the knob whole under
    its own name, and lacks the dotted ones; the fields the objects share are then left out
    (they would differ only as missing in such a run). Nothing here raises on odd values; the
    rows given are left as they are."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    fields_of: dict[str, list[dict[str, Any] | None]] = {}
    for key in keys:
        found = [config_fields(row[key]) if key in row and "." not in key else None
                 for row in rows]
        objects = [f for f in found if f is not None]
        if len(objects) >= 2 and not _same(objects):
            fields_of[key] = found
    kept: dict[str, list[str]] = {}
    for key, found in list(fields_of.items()):
        present = [f for f in found if f is not None]
        names = dict.fromkeys(name for f in present for name in f)
        if len(present) == sum(key in row for row in rows):
            kept[key] = list(names)  # the table's own rule then finds the fields that differ
            continue
        # Some runs hold no object: a field the objects share would differ only as "missing"
        # in those runs, which the knob's own column already tells; only real differences.
        kept[key] = [name for name in names
                     if any(name not in f for f in present)
                     or not _same([f[name] for f in present])]
        if not kept[key]:  # the objects differ in no field read: shown whole
            del kept[key]
    out = []
    for i, row in enumerate(rows):
        new: dict[str, Any] = {}
        for key, value in row.items():
            fields = fields_of[key][i] if key in kept else None
            if fields is None:
                new[key] = value
                continue
            for name in kept[key]:
                if name in fields:
                    new[f"{key}.{name}"] = fields[name]
        out.append(new)
    return out


def dotted_params(described: Mapping[str, str]) -> dict[str, Any]:
    """MLflow params of the fields of each knob whose value is a config object
    (``peft_config.r``, ``peft_config.lora_alpha``), so that MLflow's runs table can show the
    field that tells runs apart as a column of its own. ``described``: each knob's logged text
    (:func:`..config.knobs.describe_value`); the fields are the ones it shows (a LoRA config's
    rank, alpha, targets and whatever else is not its default), not every field of the class.
    A knob whose text reads as no object gives none."""
    return {f"{key}.{name}": value for key, text in described.items()
            for name, value in (config_fields(text) or {}).items()}
