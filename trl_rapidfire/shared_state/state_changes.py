"""What one transaction changed in the shared state, as one journal line, and back.

A line holds only the changed entries (``set``/``del`` of map entries, ``append`` to the run
order, ``put`` of whole values), so it is as long as the change, not as the state. What
changed is known without comparing the state: the maps are :class:`Tracked` dicts that note
their set and deleted keys, each :class:`~trl_rapidfire.shared_state.runs.RunState` notes its own
attribute
writes (:meth:`~trl_rapidfire.shared_state.runs.RunState.watch`), and the small parts changed in
place (the
claims' leases, the gang) are compared with a copy.
"""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..storage.outside_text import STATE_BYTES, OutsideTextError, loads
from .runs import RunState
from .state_schema import MAPS, SCALARS, BadState, check_line
from .store import Claim, ExperimentState, StoreError

__all__ = ["MAPS", "RUN_KEYED", "SCALARS", "Marks", "Tracked", "apply_line", "parse_lines",
           "runs_in_line", "watch_runs"]

# The maps keyed by run name whose entries decide what a worker may claim and what its view of
# a run is: what :meth:`~trl_rapidfire.shared_state.state_file.FileStore.take_changed_runs` reports.
RUN_KEYED = ("runs", "chunks_total", "claims", "owner", "gang_size")


class Tracked(dict):
    """A dict that remembers which keys were set or deleted since :meth:`reset`."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.changed: set[str] = set()

    def reset(self) -> None:
        if self.changed:  # a new set only when there is something to forget (most maps: not)
            self.changed = set()

    def __setitem__(self, key: str, value: Any) -> None:
        self.changed.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.changed.add(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.changed.add(key)
        return super().pop(key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def popitem(self) -> tuple[str, Any]:
        key, value = super().popitem()
        self.changed.add(key)
        return key, value

    def clear(self) -> None:
        self.changed.update(self)
        super().clear()


def watch_runs(runs: Any, touched: set[str]) -> None:
    for run in runs:
        run.watch(touched)


# Read from the dataclass, so a field added to Claim is journalled without a change here.
_CLAIM_FIELDS = tuple(f.name for f in fields(Claim))


def _encode(name: str, value: Any) -> Any:
    if name == "runs":
        return value.to_json()
    if name == "claims":  # asdict() without its recursion (a claim's fields are plain)
        return {field: getattr(value, field) for field in _CLAIM_FIELDS}
    return value


def _decode(name: str, value: Any) -> Any:
    if name == "runs":
        return RunState.from_json(value)
    if name == "claims":
        return Claim(**value)
    return value


class Marks:
    """What a transaction's body starts from, kept cheaply enough to tell what it changed.

    Run records tell on themselves (:meth:`RunState.watch`); the small parts (claims, whose
    leases change in place, and the gang) are copied; the rest are :class:`Tracked` dicts.
    """

    def __init__(self, state: ExperimentState, touched: set[str]) -> None:
        touched.clear()
        self.touched = touched
        for name in MAPS:
            value = getattr(state, name)
            if not isinstance(value, Tracked):
                value = Tracked(value)
                setattr(state, name, value)
                if name == "runs":
                    watch_runs(value.values(), touched)
            value.reset()
        self.claims = {n: (c.worker, c.chunk, c.lease_until) for n, c in state.claims.items()}
        self.gang = None if state.gang is None else copy.deepcopy(state.gang)
        self.order = list(state.order)
        self.scalars = {name: getattr(state, name) for name in SCALARS}
        self.maps = {name: getattr(state, name) for name in MAPS}
        self.state = state

    def runs_changed(self) -> set[str] | None:
        """The runs the body changed so far (in :data:`RUN_KEYED`); ``None``: it replaced a
        whole map, so possibly any."""
        names = set(self.touched)
        for name in RUN_KEYED:
            now = getattr(self.state, name)
            if now is not self.maps[name]:
                return None
            names |= now.changed
        return names

    def keys_set(self, name: str) -> set[str]:
        """The keys of map ``name`` the body set or deleted so far (every key, if it replaced
        the map whole)."""
        now = getattr(self.state, name)
        return set(now.changed) if now is self.maps[name] else set(now)

    def delta(self, state: ExperimentState) -> dict[str, Any]:
        """The change from the marked state to ``state`` as one journal line (``{}``: none)."""
        line: dict[str, Any] = {}
        sets: dict[str, dict[str, Any]] = {}
        dels: dict[str, list[str]] = {}
        for name in MAPS:
            now = getattr(state, name)
            if now is not self.maps[name]:  # replaced whole
                line.setdefault("put", {})[name] = {k: _encode(name, v) for k, v in now.items()}
                continue
            keys = set(now.changed)
            if name == "runs":
                keys |= self.touched
            elif name == "claims":
                keys |= {n for n, c in now.items()
                         if self.claims.get(n) != (c.worker, c.chunk, c.lease_until)}
            for key in keys:
                if key in now:
                    sets.setdefault(name, {})[key] = _encode(name, now[key])
                else:
                    dels.setdefault(name, []).append(key)
        if sets:
            line["set"] = sets
        if dels:
            line["del"] = dels
        puts = line.get("put", {})
        if state.order != self.order:
            n = len(self.order)
            if state.order[:n] == self.order:
                line["append"] = {"order": state.order[n:]}
            else:
                puts["order"] = list(state.order)
        if state.gang != self.gang:
            puts["gang"] = copy.deepcopy(state.gang)
        for name in SCALARS:
            if getattr(state, name) != self.scalars[name]:
                puts[name] = getattr(state, name)
        if puts:
            line["put"] = puts
        return line


def apply_line(state: ExperimentState, line: dict[str, Any], touched: set[str]) -> None:
    """Apply one journal line to ``state`` (its run names checked first: the file may have
    been edited by someone other than the experiment's author)."""
    try:
        check_line(line)
    except BadState as err:
        raise StoreError(f"{err}: the file was edited or damaged; restore it, or use another "
                         "output_dir") from None
    sets, dels, puts = line.get("set", {}), line.get("del", {}), line.get("put", {})
    appended = line.get("append", {}).get("order", [])
    for name, entries in sets.items():
        target = getattr(state, name)
        for key, value in entries.items():
            target[key] = _decode(name, value)
    for name, keys in dels.items():
        target = getattr(state, name)
        for key in keys:
            target.pop(key, None)
    if appended:
        state.order.extend(appended)
    for name, value in puts.items():
        if name in MAPS:
            value = {k: _decode(name, v) for k, v in value.items()}
        setattr(state, name, value)
    watch_runs((state.runs[k] for k in sets.get("runs", {}) if k in state.runs), touched)
    if "runs" in puts:
        watch_runs(state.runs.values(), touched)
    if "chunks_total" in sets or "chunks_total" in puts:
        state.chunks_total = {k: int(v) for k, v in state.chunks_total.items()}


def runs_in_line(line: dict[str, Any]) -> set[str] | None:
    """The runs a journal line changes (in :data:`RUN_KEYED`); ``None``: it puts a whole map or
    reorders the runs, so possibly any."""
    puts = line.get("put", {})
    if "order" in puts or any(name in puts for name in RUN_KEYED):
        return None
    names: set[str] = set(line.get("append", {}).get("order", []))
    for part in ("set", "del"):
        for name, entries in line.get(part, {}).items():
            if name in RUN_KEYED:
                names.update(entries)  # a set's dict (its keys) or a del's list
    return names


def parse_lines(data: bytes, where: Path) -> tuple[list[dict[str, Any]], int]:
    """The whole lines in ``data`` and the bytes they take (a torn last line is left out)."""
    end = data.rfind(b"\n") + 1
    lines = []
    for raw in data[:end].splitlines():
        try:
            lines.append(loads(raw, what="a line", max_bytes=STATE_BYTES))
        except OutsideTextError as err:
            raise StoreError(f"{where} has a damaged line ({err}): restore it, or use another "
                             "output_dir") from None
    return lines, end
