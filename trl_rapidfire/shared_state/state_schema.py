"""The shared state's document, checked as data before any of it is used.

``scheduler.json`` and the lines of ``scheduler.journal`` are read back by every worker and
every re-run, and anyone who can write into ``output_dir`` can edit them. Names in them become
paths, recipes become runs, and a journal line names the parts of the state it changes; so a
document is held to exactly what the package writes: known keys only, each value of its type,
every run name ``run-<n>`` wherever it appears (a record's own name included), every worker id
and op text of bounded length. A line that names anything else (``{"set": {"__dict__": ...}}``)
is refused whole, before it changes anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..storage.names import UntrustedValue, is_run_name
from ..storage.outside_text import OP_TEXT_BYTES, SMALL_FILE_BYTES
from .runs import RunStatus

__all__ = ["MAPS", "SCALARS", "BadState", "check_document", "check_line", "is_proposal"]

# Maps whose entries a journal line sets or deletes one by one (the others are replaced whole).
MAPS = ("runs", "chunks_total", "claims", "owner", "last_run", "clones", "gang_size", "seen",
        "idle")
SCALARS = ("fingerprint", "ready", "wall_seconds", "searching")
_WHOLE = frozenset({*MAPS, *SCALARS, "order", "gang"})
_LINE_KEYS = frozenset({"set", "del", "put", "append"})
_DOC_KEYS = frozenset({"format", "version", "generation", *_WHOLE})
_RUN_KEYS = frozenset({"name", "knobs", "status", "chunks_done", "global_step", "error",
                       "parent", "warm_start", "durable_chunks", "durable_step"})
_TEXT = 4096  # a worker id, a fingerprint, a launch id, a run's error (cut to this)


class BadState(UntrustedValue):
    """A state document or journal line that is not what the package writes."""


def _fail(where: str, why: str) -> BadState:
    return BadState(f"{where}: {why}")


def _run_name(value: Any, where: str) -> None:
    if not is_run_name(value):
        raise _fail(where, f"{value!r} is not a run name (run-<n>)")


def _count(value: Any, where: str, *, least: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _fail(where, f"{value!r} is not a whole number of at least {least}")


def _text(value: Any, where: str, limit: int = _TEXT) -> None:
    if not isinstance(value, str) or len(value) > limit:
        raise _fail(where, f"expected text of at most {limit} characters, got "
                    f"{type(value).__name__}")


def _number(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(where, f"{value!r} is not a finite number")


def is_proposal(recipe: Any) -> bool:
    """Whether ``recipe`` (an entry of ``clones``) is a search's proposal: its trial number
    and the sampler's parameters as JSON text, nothing else (the search maps them back to knob
    values, checking each against the knob's candidates)."""
    return (isinstance(recipe, dict) and set(recipe) == {"trial", "params"}
            and isinstance(recipe["trial"], str) and recipe["trial"].isdigit()
            and len(recipe["trial"]) <= 9 and isinstance(recipe["params"], str)
            and len(recipe["params"]) <= SMALL_FILE_BYTES)


def _run(key: str, value: Any, where: str) -> None:
    if not isinstance(value, dict) or set(value) - _RUN_KEYS or "name" not in value:
        raise _fail(where, f"a run's record has the keys {sorted(_RUN_KEYS)}")
    if value["name"] != key:
        raise _fail(where, f"the record of {key!r} is named {value['name']!r}")
    if not isinstance(value.get("knobs", {}), dict):
        raise _fail(where, "a run's knobs are a mapping")
    if value.get("status", "pending") not in {s.value for s in RunStatus}:
        raise _fail(where, f"{value.get('status')!r} is not a run status")
    _count(value.get("chunks_done", 0), f"{where}.chunks_done")
    _count(value.get("global_step", 0), f"{where}.global_step")
    _count(value.get("durable_chunks", 0), f"{where}.durable_chunks")
    _count(value.get("durable_step", 0), f"{where}.durable_step")
    if value.get("error") is not None:
        _text(value["error"], f"{where}.error", limit=SMALL_FILE_BYTES)
    if value.get("parent") is not None:
        _run_name(value["parent"], f"{where}.parent")
    if not isinstance(value.get("warm_start", False), bool):
        raise _fail(where, "warm_start is true or false")


def _claim(key: str, value: Any, where: str) -> None:
    if not isinstance(value, dict) or set(value) != {"worker", "chunk", "lease_until"}:
        raise _fail(where, "a claim is {worker, chunk, lease_until}")
    _text(value["worker"], f"{where}.worker")
    _count(value["chunk"], f"{where}.chunk")
    _number(value["lease_until"], f"{where}.lease_until")


def _recipe(key: str, value: Any, where: str) -> None:
    if is_proposal(value):
        return
    if not isinstance(value, dict) or set(value) != {"parent", "op"}:
        raise _fail(where, f"a recipe is {{parent, op}} or {{trial, params}}, got {value!r}"[:300])
    _run_name(value["parent"], f"{where}.parent")
    _text(value["op"], f"{where}.op", limit=OP_TEXT_BYTES)


def _worker_entry(key: str, value: Any, where: str) -> None:
    _text(value, where)


# How one entry of each map is checked (its key is a run name, except last_run's, seen's and
# idle's: a worker).
_ENTRY: dict[str, Callable[[str, Any, str], None]] = {
    "runs": _run,
    "chunks_total": lambda k, v, w: _count(v, w),
    "claims": _claim,
    "owner": _worker_entry,
    "last_run": lambda k, v, w: _run_name(v, w),
    "clones": _recipe,
    "gang_size": lambda k, v, w: _count(v, w, least=1),
    "seen": lambda k, v, w: _number(v, w),
    "idle": lambda k, v, w: _number(v, w),
}


def _entry(name: str, key: Any, value: Any, where: str) -> None:
    here = f"{where}.{name}[{str(key)[:40]!r}]"
    if name in ("last_run", "seen", "idle"):  # keyed by worker
        _text(key, here)
    else:
        _run_name(key, here)
    _ENTRY[name](key, value, here)


def _map(name: str, value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise _fail(f"{where}.{name}", "expected a mapping")
    for key, entry in value.items():
        _entry(name, key, entry, where)


def _names(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise _fail(where, "expected a list of run names")
    for item in value:
        _run_name(item, where)


def _gang(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) != {"run", "chunk", "members", "done"}:
        raise _fail(where, "a gang is {run, chunk, members, done}")
    _run_name(value["run"], f"{where}.run")
    _count(value["chunk"], f"{where}.chunk")
    for part in ("members", "done"):
        if not isinstance(value[part], list):
            raise _fail(f"{where}.{part}", "expected a list of workers")
        for worker in value[part]:
            _text(worker, f"{where}.{part}")


def _scalar(name: str, value: Any, where: str) -> None:
    if name in ("fingerprint", "ready"):
        _text(value, f"{where}.{name}")
    elif name == "wall_seconds":
        _number(value, f"{where}.{name}")
    elif not isinstance(value, bool):  # searching
        raise _fail(f"{where}.{name}", "expected true or false")


def _whole(name: str, value: Any, where: str) -> None:
    if name in MAPS:
        _map(name, value, where)
    elif name == "order":
        _names(value, f"{where}.order")
    elif name == "gang":
        _gang(value, f"{where}.gang")
    else:
        _scalar(name, value, where)


def check_document(doc: Any, where: str = "the scheduler state") -> None:
    """:class:`BadState` unless ``doc`` is a whole state as ``ExperimentState.to_json``
    writes it (the format and version are checked by the reader)."""
    if not isinstance(doc, dict):
        raise _fail(where, "expected a JSON object")
    unknown = set(doc) - _DOC_KEYS
    if unknown:
        raise _fail(where, f"unknown keys {sorted(map(str, unknown))[:5]}")
    for name in ("fingerprint", "runs", "chunks_total", "order", "claims"):
        if name not in doc:
            raise _fail(where, f"{name!r} is missing")
    for name in _WHOLE:
        if name in doc:
            _whole(name, doc[name], where)


def check_line(line: Any, where: str = "a journal line") -> None:
    """:class:`BadState` unless ``line`` is a change as the journal writes it: ``set`` and
    ``del`` of map entries, ``append`` to the run order, ``put`` of whole parts."""
    if not isinstance(line, dict) or set(line) - _LINE_KEYS:
        raise _fail(where, f"a change has only the parts {sorted(_LINE_KEYS)}")
    sets, dels = line.get("set", {}), line.get("del", {})
    puts, appended = line.get("put", {}), line.get("append", {})
    for part, value, allowed in (("set", sets, MAPS), ("del", dels, MAPS),
                                 ("put", puts, _WHOLE), ("append", appended, ("order",))):
        if not isinstance(value, dict) or set(value) - set(allowed):
            raise _fail(f"{where}.{part}", f"names only {sorted(allowed)}")
    for name, entries in sets.items():
        if not isinstance(entries, dict):
            raise _fail(f"{where}.set.{name}", "expected a mapping")
        for key, value in entries.items():
            _entry(name, key, value, f"{where}.set")
    for name, keys in dels.items():
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _fail(f"{where}.del.{name}", "expected a list of keys")
    for name, value in puts.items():
        _whole(name, value, f"{where}.put")
    if "order" in appended:
        _names(appended["order"], f"{where}.append.order")

