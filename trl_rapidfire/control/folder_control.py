"""Control through the experiment's folder, for an experiment MLflow does not track
(``report_to="none"``): the CLI drops an op into ``<output_dir>/.rapidfire/inbox/`` and the
training process applies it at its next chunk boundary, as it applies an op set as a run tag;
``.rapidfire/alive.json`` says which process is training the experiment now.

The files are data, never code: an op file holds a run name and an op's text, both checked as
a tag's are, before the file is left (:func:`.control_send.deliver_op`) and when it is applied
(:mod:`.trust`); a file that does not parse is answered as a bad op. Every op file is written
atomically (a temporary name, then a rename), so the training process never reads half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..shared_state.runs import RunState
from ..shared_state.worker_info import process_alive
from ..storage.layout import Layout, run_order
from ..storage.names import UntrustedValue
from ..storage.outside_text import OP_TEXT_BYTES, loads
from ..storage.own_files import read_bytes, write_atomic

if TYPE_CHECKING:
    from ..shared_state.store import ExperimentState

__all__ = ["LOOK_DEPTH", "Inbox", "InboxOp", "Liveness", "alive", "folder_runs", "is_untracked",
           "live_folders", "mark_alive", "mark_ended", "training_now"]

# An op file is {"run": ..., "op": ...}: the op's text and a little more.
_OP_FILE_BYTES = OP_TEXT_BYTES + 1024

@dataclass(frozen=True)
class InboxOp:
    """An op taken from the inbox: its run and text; or, for a file that is not an op,
    ``run=""``, ``op`` naming the file and ``problem`` saying why (the op's answer). ``path``
    is the file, removed (:meth:`Inbox.done`) once the op is answered."""

    run: str
    op: str
    path: Path | None = None
    problem: str | None = None


class Inbox:
    """The op files of one experiment, oldest first.

    Args:
        layout: the experiment's paths.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.folder = layout.inbox
        self._refusal_said = False
        # (device, inode, mtime) of the folder when a read last found it empty.
        self._empty_at: tuple[int, int, int] | None = None

    def post(self, run: str, op: str) -> Path:
        """Leave ``op`` for ``run``; returns the file. The name orders ops by arrival."""
        self.layout.check_links()  # the folders are made by the write path, never through a link
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        write_atomic(self.folder / name, json.dumps({"run": run, "op": op}))
        return self.folder / name

    def has_mail(self) -> bool:
        """Whether an op waits; asked at every chunk boundary.

        The folder is read only when it may have changed: adding or removing a file moves its
        modification time, so while that is what it was at the last read, which found it
        empty, one ``stat`` answers (a directory read cost a one-step chunk 3% on the tiny
        model). A folder changed in the last 2 s is read anyway: some filesystems keep times
        in whole seconds, and a file added in the second of the last read would not move it.
        """
        try:
            st = os.stat(self.folder)
        except (FileNotFoundError, NotADirectoryError):
            return False
        seen = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if seen == self._empty_at and time.time_ns() - st.st_mtime_ns > 2_000_000_000:
            return False
        waiting = self.waiting()
        self._empty_at = seen if waiting == 0 else None
        return waiting > 0

    def waiting(self) -> int:
        """How many ops wait for the next chunk boundary."""
        try:
            with os.scandir(self.folder) as entries:
                return sum(1 for e in entries
                           if e.name.endswith(".json") and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return 0

    def take(self) -> list[InboxOp]:
        """Every waiting op, oldest first, left in place until :meth:`done`. A file that is
        not such an op comes back with ``run=""`` and why, to be answered as a bad op."""
        try:
            self.layout.check_inbox()
        except UntrustedValue as err:
            if self._refusal_said:
                return []
            self._refusal_said = True  # said once, in the op log; nothing there is read
            return [InboxOp("", "<the inbox>", problem=f"the inbox is not read: {err}")]
        try:
            names = sorted(n for n in os.listdir(self.folder)
                           if n.endswith(".json") and not n.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
        ops = []
        for name in names:
            path = self.folder / name
            what = f"op file {name}"
            try:
                doc = loads(read_bytes(path, max_bytes=_OP_FILE_BYTES, what=what), what=what,
                            max_bytes=_OP_FILE_BYTES, max_depth=2)
                if not isinstance(doc, dict) or set(doc) != {"run", "op"}:
                    raise ValueError("it is not {\"run\": ..., \"op\": ...}")
                run, op = doc["run"], doc["op"]
                if not isinstance(run, str) or not isinstance(op, str):
                    raise ValueError("run and op must be text")
                ops.append(InboxOp(run, op, path))
            except FileNotFoundError:
                continue
            except ValueError as err:  # OutsideTextError and LinkRefused are ValueErrors
                ops.append(InboxOp("", f"<op file {name}>", path,
                                   problem=f"unreadable op file {name}: {err}"))
        return ops

    def done(self, op: InboxOp) -> None:
        """``op`` is answered: its file goes (a link is removed, never its target)."""
        if op.path is not None:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(op.path)


@dataclass(frozen=True)
class Liveness:
    """Who trains the experiment: ``host`` and ``pid`` of its first worker."""

    host: str
    pid: int
    since: float


# The folders this process is training in now (a notebook's train(blocking=False) goes on
# while the next cell builds another experiment): alive.json names the process, not the call.
_TRAINING_HERE: set[str] = set()


def mark_alive(layout: Layout) -> None:
    """This process trains the experiment from now on (its first worker says so)."""
    _TRAINING_HERE.add(os.path.realpath(layout.output_dir))
    path = layout.alive_file  # its folder made by the write path, never through a link
    write_atomic(path, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                   "since": time.time()}))


def mark_ended(layout: Layout) -> None:
    """The ``train()`` call that :func:`mark_alive` announced ended."""
    _TRAINING_HERE.discard(os.path.realpath(layout.output_dir))
    who = _read_alive(layout)
    if who is not None and who.pid == os.getpid() and who.host == socket.gethostname():
        with contextlib.suppress(OSError):
            layout.alive_file.unlink()
    # gone, or another process's (a later run of the script): not ours to remove


def _read_alive(layout: Layout) -> Liveness | None:
    try:
        doc = loads(read_bytes(layout.alive_file), what=str(layout.alive_file), max_depth=2)
        who = Liveness(str(doc["host"]), int(doc["pid"]), float(doc["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # A pid of 0 or below names a process group to kill(); beyond pid_max, no process.
    return who if 0 < who.pid < 1 << 22 else None


def alive(layout: Layout) -> Liveness | None:
    """The process training the experiment, if one is: on this machine its pid must be alive
    (a process killed outright leaves the file behind); on another machine the file is taken
    at its word."""
    who = _read_alive(layout)
    if who is None:
        return None
    if who.host == socket.gethostname():
        try:
            os.kill(who.pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
    return who


def training_now(layout: Layout, state: ExperimentState | None) -> str | None:
    """Who else trains the experiment in ``layout``'s folder at this moment, said for a
    person, or ``None``: a live process on this machine (``alive.json``), or a worker on
    another machine whose claim's lease has not run out (``state``, the shared state)."""
    here, me = socket.gethostname(), os.getpid()
    if os.path.realpath(layout.output_dir) in _TRAINING_HERE:
        return "this process (a train() that has not returned, e.g. train(blocking=False))"
    who = alive(layout)
    if who is not None and who.host == here and who.pid != me:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who.since))
        return f"process {who.pid} on this machine, training since {since}"
    if state is not None:
        now = time.time()
        for run, claim in state.claims.items():
            if claim.lease_until > now and process_alive(claim.worker) is None:
                host = claim.worker.rsplit(":", 2)[0]
                return (f"a worker on {host}, training {run} (its lease runs for another "
                        f"{claim.lease_until - now:.0f} s)")
    return None


def is_untracked(output_dir: str | os.PathLike) -> bool:
    """Whether ``output_dir`` holds an experiment that MLflow does not track (its scheduler
    state, no MLflow experiment id)."""
    layout = Layout(output_dir)
    return layout.scheduler_state.is_file() and not layout.experiment_marker.is_file()


# Where the CLI looks for an experiment whose train() has started before the tracking store
# knows it (the store is made on the tracking thread, seconds in): the folder it runs in and
# the folders this many levels below (a script's output_dir is mostly ``outputs/<name>``).
LOOK_DEPTH = 2
# The most folders one look reads (a home folder has thousands): the CLI answers at once.
_LOOK_FOLDERS = 2000
# Folders no experiment is kept in, and whose size would use up the look.
_NOT_LOOKED_IN = frozenset({"node_modules", "__pycache__", "site-packages", "mlruns"})


def live_folders(root: str | os.PathLike, depth: int = LOOK_DEPTH) -> list[Path]:
    """The experiment folders at ``root`` or up to ``depth`` levels below it that a live
    process trains now (their ``.rapidfire/alive.json``, :func:`alive`), in name order.

    Links are not followed (a look never leaves ``root``) and hidden folders are skipped;
    at most a bounded number of folders is read, breadth first, so that a look from a large
    folder still answers at once."""
    found: list[Path] = []
    level, read = [Path(root)], 0
    for below in range(depth + 1):
        deeper: list[Path] = []
        for folder in level:
            if alive(Layout(folder)) is not None:
                found.append(folder)
                continue  # an experiment's own folders hold no other experiment
            if below == depth or read >= _LOOK_FOLDERS:
                continue
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        if (not entry.name.startswith(".") and entry.name not in _NOT_LOOKED_IN
                                and entry.is_dir(follow_symlinks=False)):
                            deeper.append(Path(entry.path))
            except OSError:  # unreadable, or gone meanwhile: nothing of ours there
                continue
            read += 1
        level = sorted(deeper)[:max(_LOOK_FOLDERS - read, 0)]
    return sorted(found)


def folder_runs(output_dir: str | os.PathLike) -> list[RunState]:
    """The runs of the experiment in ``output_dir`` as its shared state has them, in run
    order (read only)."""
    from ..shared_state.state_file import FileStore

    state = FileStore(Layout(output_dir).state_dir, fingerprint="", create=False).peek()
    runs = [] if state is None else list(state.runs.values())
    return sorted(runs, key=lambda r: run_order(r.name))
