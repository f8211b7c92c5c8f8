"""Control through the experiment's folder, for an experiment MLflow does not track
(``report_to="none"``): the CLI drops an op into ``<output_dir>/.rapidfire/inbox/`` and the
training process applies it at its next chunk boundary, as it applies an op set as a run tag;
``.rapidfire/alive.json`` says which process is training the experiment now.

The files are data, never code: an op file holds a run name and an op's text, both checked as
a tag's are, before the file is left (:func:`.control.deliver_op`) and when it is applied
(:mod:`.trust`); a file that does not parse is answered as a bad op. Every op file is written
atomically (a temporary name, then a rename), so the training process never reads half of one.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .layout import Layout, run_order
from .runs import RunState

__all__ = ["Inbox", "Liveness", "alive", "folder_runs", "is_untracked", "mark_alive",
           "mark_ended"]


class Inbox:
    """The op files of one experiment, oldest first.

    Args:
        layout: the experiment's paths.
    """

    def __init__(self, layout: Layout) -> None:
        self.folder = layout.inbox

    def post(self, run: str, op: str) -> Path:
        """Leave ``op`` for ``run``; returns the file. The name orders ops by arrival."""
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(json.dumps({"run": run, "op": op}), encoding="utf-8")
        os.replace(tmp, self.folder / name)
        return self.folder / name

    def has_mail(self) -> bool:
        """Whether an op waits (one directory read; called at every boundary)."""
        return self.waiting() > 0

    def waiting(self) -> int:
        """How many ops wait for the next chunk boundary."""
        try:
            with os.scandir(self.folder) as entries:
                return sum(1 for e in entries
                           if e.name.endswith(".json") and not e.name.startswith("."))
        except FileNotFoundError:
            return 0

    def take(self) -> list[tuple[str, str]]:
        """Remove and return every waiting op as ``(run, op text)``, oldest first. A file that
        is not such an op comes back as ``("", <why>)``, to be answered as a bad op."""
        try:
            names = sorted(n for n in os.listdir(self.folder)
                           if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return []
        ops = []
        for name in names:
            path = self.folder / name
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                run, op = doc["run"], doc["op"]
                if not isinstance(run, str) or not isinstance(op, str):
                    raise TypeError("run and op must be text")
                ops.append((run, op))
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as err:
                ops.append(("", f"<unreadable op file {name}: {err}>"))
            path.unlink(missing_ok=True)
        return ops


@dataclass(frozen=True)
class Liveness:
    """Who trains the experiment: ``host`` and ``pid`` of its first worker."""

    host: str
    pid: int
    since: float


def mark_alive(layout: Layout) -> None:
    """This process trains the experiment from now on (its first worker says so)."""
    path = layout.alive_file
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                               "since": time.time()}), encoding="utf-8")
    os.replace(tmp, path)


def mark_ended(layout: Layout) -> None:
    """The ``train()`` call that :func:`mark_alive` announced ended."""
    path = layout.alive_file
    try:
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass  # gone, or another process's (a later run of the script): not ours to remove


def alive(layout: Layout) -> Liveness | None:
    """The process training the experiment, if one is: on this machine its pid must be alive
    (a process killed outright leaves the file behind); on another machine the file is taken
    at its word."""
    try:
        doc = json.loads(layout.alive_file.read_text(encoding="utf-8"))
        who = Liveness(str(doc["host"]), int(doc["pid"]), float(doc["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if who.host == socket.gethostname():
        try:
            os.kill(who.pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
    return who


def is_untracked(output_dir: str | os.PathLike) -> bool:
    """Whether ``output_dir`` holds an experiment that MLflow does not track (its scheduler
    state, no MLflow experiment id)."""
    layout = Layout(output_dir)
    return layout.scheduler_state.is_file() and not layout.experiment_marker.is_file()


def folder_runs(output_dir: str | os.PathLike) -> list[RunState]:
    """The runs of the experiment in ``output_dir`` as its shared state has them, in run
    order (read only)."""
    from .state_file import FileStore

    state = FileStore(Layout(output_dir).state_dir, fingerprint="", create=False).peek()
    runs = [] if state is None else list(state.runs.values())
    return sorted(runs, key=lambda r: run_order(r.name))
