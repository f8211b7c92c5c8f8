"""Which processes train an experiment's folder, and the rule that keeps a second one out.

Every worker notes itself in ``.rapidfire/workers.json`` when its first ``run()`` registers
(:func:`join`, under the shared state's lock) and takes itself out when a ``run()`` call ends
(:func:`leave`); a process killed outright leaves its entry, which is then read as gone (its pid
on this machine, its lease on another).

The rule (docs/security.md, "One experiment in a folder at a time"): a process started on its
own (``python script.py``, no launcher) trains a folder only when no other process does. A
second one is refused at once, naming the first's host and pid, before it builds anything on
disk or in MLflow (:func:`check_alone`, from the coordinator's constructor), and again, under
the lock, when its first ``run()`` registers (two started together). The several-machines path
is a launch: its workers share a launch id and train together. A new launch over an old
launch's leftover workers is left to them (they stop at their next boundary, see "Workers whose
launcher died"), as before.

Split from :mod:`.coordination` along the seam "who may train here" (worker registration and
liveness) versus "what each worker trains" (claims and chunk records).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..control.folder_control import alive
from ..shared_state.worker_info import WorkerInfo, process_alive
from ..storage.layout import Layout
from ..storage.outside_text import loads
from ..storage.own_files import read_bytes, write_atomic

__all__ = ["FolderTaken", "Trainer", "check_alone", "join", "leave", "other_trainer",
           "registered"]

_FILE = "workers.json"
_MAX_BYTES = 4 << 20  # thousands of workers' entries, bounded (the folder is shared)


class FolderTaken(RuntimeError):
    """Another process trains this experiment's folder now, and this one may not join it."""


@dataclass(frozen=True)
class Trainer:
    """A process that trains the folder: ``launch`` is empty for a plain process."""

    host: str
    pid: int
    since: float
    launch: str = ""

    def describe(self) -> str:
        """``process 41237 on gpu-3, training since 2026-12-03 14:02:11``."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"process {self.pid} on {self.host}, training since {when}"


def _path(layout: Layout) -> Path:
    return layout.state_dir / _FILE


def registered(layout: Layout) -> dict[str, Trainer]:
    """The workers noted in the folder, by worker id (``host:pid:token``); a missing or
    unreadable file is none."""
    try:
        doc = loads(read_bytes(_path(layout), max_bytes=_MAX_BYTES), what=str(_path(layout)),
                    max_bytes=_MAX_BYTES, max_depth=3)
    except (OSError, ValueError):
        return {}
    found = {}
    for wid, entry in doc.items() if isinstance(doc, dict) else ():
        try:
            host, pid, _ = str(wid).rsplit(":", 2)
            found[str(wid)] = Trainer(host, int(pid), float(entry["since"]),
                                      str(entry.get("launch", "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not an entry of ours: ignored, dropped at the next write
    return found


def _write(layout: Layout, workers: dict[str, Trainer]) -> None:
    doc = {wid: {"since": t.since, "launch": t.launch} for wid, t in workers.items()}
    write_atomic(_path(layout), json.dumps(doc))


def _lives(wid: str, state: Any) -> bool:
    """Whether worker ``wid`` still trains: its pid on this machine; on another, a claim whose
    lease holds (``state``: the shared state, or ``None`` when not read)."""
    here = process_alive(wid)
    if here is not None:
        return here
    now = time.time()
    claims = getattr(state, "claims", {}) if state is not None else {}
    return any(c.worker == wid and c.lease_until > now for c in claims.values())


def other_trainer(layout: Layout, me: WorkerInfo, state: Any = None) -> Trainer | None:
    """Another process that trains the folder now and that ``me`` may not train beside, or
    ``None``: for a plain process, any other live one; for a launch's worker, a live plain
    process (a launch's own workers, and an older launch's leftovers, are let be)."""
    for wid, other in registered(layout).items():
        if wid == me.id or (me.launch and other.launch == me.launch):
            continue
        if me.launched and other.launch:
            continue
        if _lives(wid, state):
            return other
    if not me.launched:
        # The process that marked the folder alive (before its first run() registered it).
        who = alive(layout)
        if who is not None and who.host == socket.gethostname() and who.pid != os.getpid():
            return Trainer(who.host, who.pid, who.since)
    return None


def _refusal(layout: Layout, other: Trainer) -> FolderTaken:
    return FolderTaken(
        f"{layout.output_dir} is being trained now by {other.describe()}. One experiment "
        "trains in a folder at a time, by one process or by the workers of one launch: let "
        "that one end (a re-run then continues the experiment), or use another output_dir. "
        "To train it on more GPUs or machines, start it once under accelerate launch or "
        "torchrun (docs/several-machines.md).")


def check_alone(layout: Layout, me: WorkerInfo) -> None:
    """Raise :class:`FolderTaken` if another process trains the folder that ``me`` may not
    join (read only: nothing is written)."""
    other = other_trainer(layout, me)
    if other is not None:
        raise _refusal(layout, other)


def join(layout: Layout, me: WorkerInfo, state: Any) -> None:
    """Inside the shared state's transaction (its lock held): refuse ``me`` if another process
    trains the folder (:func:`check_alone`), else note ``me`` among its workers, dropping the
    entries of workers that are gone."""
    other = other_trainer(layout, me, state)
    if other is not None:
        raise _refusal(layout, other)
    workers = {wid: t for wid, t in registered(layout).items() if _lives(wid, state)}
    host, pid, _ = me.id.rsplit(":", 2)
    workers[me.id] = Trainer(host, int(pid), time.time(), me.launch)
    _write(layout, workers)


def leave(layout: Layout, me: WorkerInfo) -> None:
    """Inside the shared state's transaction: ``me`` no longer trains the folder (its
    ``run()`` call ended); advisory, so a write that fails is let be."""
    workers = registered(layout)
    if workers.pop(me.id, None) is not None:
        with contextlib.suppress(OSError):
            _write(layout, workers)
