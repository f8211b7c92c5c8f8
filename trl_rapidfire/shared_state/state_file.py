"""The shared scheduler state on disk: a snapshot, a journal of changes, and a file lock.

Every worker changes the state (:class:`~trl_rapidfire.shared_state.store.ExperimentState`) only
inside a
:meth:`FileStore.transaction`, under an exclusive file lock. What a transaction changed is
appended to ``scheduler.journal`` as one JSON line (only the changed entries: a claim, one
run's record), so its cost does not grow with the number of runs. Each process keeps the state
in memory and, on taking the lock, reads only the lines other processes appended since its
last transaction. When the journal has grown past the snapshot's size, it is folded into a new
``scheduler.json`` (compaction, amortised over many transactions).

Crash safety: a line is one ``write`` (appended with ``O_APPEND``); a durable transaction
fsyncs the journal before the lock is released. A line a crash cut short has no newline, is
ignored and cut off by the next writer. Compaction writes the new snapshot (fsync, rename)
before it replaces the journal (fsync, rename): both carry a *generation*, and a journal older
than its snapshot (a crash between the two renames) is already in the snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..storage.atomic_folders import fsync_dir
from ..storage.faults import ExperimentFault, disk_fault, fault_message
from ..storage.filesystems import known_local
from ..storage.outside_text import STATE_BYTES, loads
from ..storage.own_files import open_nofollow, read_bytes, write_atomic
from ..storage.write_path import open_folder
from .flock import LockUnsupported, flock_for
from .state_changes import Marks, apply_line, parse_lines, runs_in_line, watch_runs
from .store import ExperimentState, StoreError

__all__ = ["FileStore"]

_JOURNAL_FORMAT = "trl-rapidfire/scheduler-journal"
_MIN_COMPACT_BYTES = 64 * 1024


@dataclass
class _Cache:
    """This process's copy of the state, and where in the journal it is up to."""

    state: ExperimentState
    fd: int  # the journal, kept open: its inode cannot be reused while we hold it
    inode: tuple[int, int]
    offset: int
    generation: int
    snapshot_bytes: int
    touched: set[str] = field(default_factory=set)  # runs changed since the last mark
    start: int = 0  # where the journal's lines begin (after its header)


class FileStore:
    """The shared state in ``<folder>/scheduler.json`` + ``scheduler.journal``, behind a lock.

    Args:
        folder: ``<output_dir>/.rapidfire`` (created if missing).
        fingerprint: the expanded runs' fingerprint; opening a state made for other runs is a
            :class:`StoreError`.
        create: create the folder and the state now (else at the first transaction: building
            an experiment writes nothing before it trains).
    """

    def __init__(self, folder: str | os.PathLike, fingerprint: str, *,
                 create: bool = True) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "scheduler.json"
        self.journal_path = self.folder / "scheduler.journal"
        # One lock per process and path; each thread holds its own descriptor of it, so the
        # threads of one process are excluded from each other too.
        self._lock_path = str(self.path) + ".lock"
        self._lock = flock_for(self._lock_path)
        self._folder_made = False
        self.fingerprint = fingerprint
        self._cache: _Cache | None = None
        # The change feed (see take_changed_runs): runs changed since it was last taken, by
        # any process; None: the state was read whole, so possibly any.
        self._changed: set[str] | None = None
        self._marks: Marks | None = None  # the running transaction's starting point
        self._local: bool | None = None  # the folder is on a local filesystem (first use)
        if create:
            with self.transaction():
                pass

    def recorded_fingerprint(self) -> str | None:
        """The fingerprint of the experiment whose state is in ``folder`` (``None``: none is),
        read without writing anything; :class:`StoreError` if the file is not a state."""
        state = self.peek()
        return None if state is None else state.fingerprint

    def peek(self) -> ExperimentState | None:
        """The state on disk as it is now (``None``: none yet), read without the lock and
        without writing anything (a look from outside: the CLI); :class:`StoreError` if it is
        not a state."""
        for _ in range(20):  # a compaction between the two reads: read both again
            snapshot = self._read_snapshot()
            if snapshot is None:
                return None
            state, generation, _ = snapshot
            try:
                data = read_bytes(self.journal_path, max_bytes=STATE_BYTES)
            except FileNotFoundError:
                return state
            except ValueError as err:  # a link, or beyond any real journal's size
                raise StoreError(str(err)) from None
            header, lines, _ = self._journal_lines(data)
            if header == generation:
                for line in lines:
                    apply_line(state, line, set())
                return state
            if header is not None and header < generation:
                return state  # the journal is already folded into the snapshot
        raise StoreError(f"{self.journal_path} does not follow {self.path} (generations differ): "
                         "the files were edited or damaged; restore them, or use another "
                         "output_dir")

    @contextlib.contextmanager
    def transaction(self, durable: bool = True) -> Iterator[ExperimentState]:
        """Bring this process's copy up to date, let the body change it, journal the change;
        all under the lock.

        ``durable=False`` skips the fsync: for changes a power cut may lose harmlessly, like a
        claim or a lease renewal (the run is simply claimed again). A body that raises
        journals nothing (and this process reads the state again next time).
        """
        with self._locked():
            cache = self._current()
            state = cache.state if cache is not None else ExperimentState(self.fingerprint)
            if state.fingerprint != self.fingerprint:
                raise StoreError(
                    f"{self.path} belongs to an experiment with other runs (fingerprint "
                    f"{state.fingerprint[:12]}, these runs {self.fingerprint[:12]}): use "
                    "another output_dir, or run the configs it was made for."
                )
            marks = Marks(state, cache.touched if cache is not None else set())
            self._marks = marks
            try:
                yield state
                if cache is None:
                    self._compact(state, generation=0)
                    return
                line = marks.delta(state)
                if line:
                    self._append(cache, line, durable)
                    self._note(runs_in_line(line))
                    # Runs the body added: their later changes are journalled too.
                    watch_runs((state.runs[k] for k in marks.keys_set("runs") if k in state.runs),
                           cache.touched)
                if cache.offset > max(_MIN_COMPACT_BYTES, cache.snapshot_bytes):
                    self._compact(state, generation=cache.generation + 1)
            except BaseException:
                self._forget()  # the copy may hold the body's half-made change
                raise
            finally:
                self._marks = None

    def take_changed_runs(self) -> set[str] | None:
        """Inside a transaction: the runs whose record, plan, claim or owner changed since the
        last call, whoever changed them (other processes' journal lines, this process's
        earlier transactions, the running body so far); ``None`` when possibly any did (the
        state was read whole). What lets a worker keep its view and its queue of runs up to
        date in time that grows with the changes, not with the number of runs."""
        if self._marks is None:
            raise RuntimeError("take_changed_runs() is only valid inside a transaction")
        changed, self._changed = self._changed, set()
        body = self._marks.runs_changed()
        if changed is None or body is None:
            return None
        return changed | body

    def _note(self, names: set[str] | None) -> None:
        if names is None:
            self._changed = None
        elif self._changed is not None:
            self._changed |= names

    def compact(self) -> None:
        """Fold the journal into ``scheduler.json`` now (e.g. as an experiment ends, so the
        snapshot alone is the whole state)."""
        with self._locked():
            cache = self._current()
            if cache is not None and cache.offset > cache.start:
                self._compact(cache.state, generation=cache.generation + 1)

    def read(self) -> ExperimentState:
        """A copy of the state (under the lock, nothing written)."""
        with self._locked():
            cache = self._current()
            if cache is None:
                return ExperimentState(self.fingerprint)
            return ExperimentState.from_json(cache.state.to_json())

    def close(self) -> None:
        """Let go of this process's copy (and the journal's file descriptor)."""
        with self._locked():
            self._forget()

    def __del__(self) -> None:
        cache = getattr(self, "_cache", None)
        if cache is not None:
            with contextlib.suppress(OSError):
                os.close(cache.fd)

    # ------------------------------------------------------------------ the files

    def _read_snapshot(self) -> tuple[ExperimentState, int, int] | None:
        try:
            text = read_bytes(self.path, max_bytes=STATE_BYTES)
            doc = loads(text, what="it", max_bytes=STATE_BYTES)
            generation = doc.get("generation", 0) if isinstance(doc, dict) else None
            if isinstance(generation, bool) or not isinstance(generation, int):
                raise StoreError(f"its generation is {generation!r}, not a whole number")
            return ExperimentState.from_json(doc), generation, len(text)
        except FileNotFoundError:
            return None
        except (KeyError, TypeError, ValueError, StoreError) as err:
            raise StoreError(f"{self.path} is not a valid scheduler state: {err}") from None

    def _journal_lines(self, data: bytes) -> tuple[int | None, list[dict[str, Any]], int]:
        """The journal ``data``'s generation, its change lines, and the bytes its whole lines
        take (a torn last line left out)."""
        lines, used = parse_lines(data, self.journal_path)
        if not lines:
            return None, [], used
        header = lines[0]
        if not isinstance(header, dict) or header.get("format") != _JOURNAL_FORMAT:
            raise StoreError(f"{self.journal_path} is not a trl-rapidfire scheduler journal")
        try:
            return int(header["generation"]), lines[1:], used
        except (KeyError, TypeError, ValueError):
            raise StoreError(f"{self.journal_path} has no generation in its header") from None

    def _bad_line(self, err: Exception) -> StoreError:
        return StoreError(f"{self.journal_path} has a line that is not a change of the state "
                          f"({err}): restore it, or use another output_dir")

    def _current(self) -> _Cache | None:
        """Under the lock: this process's copy, with what others appended since read in."""
        cache = self._cache
        if cache is not None and self._on_local_disk():
            # One kernel serves the file to every process: the kept descriptor sees their
            # appends; a journal replaced by a compaction (or anything else) is another inode.
            try:
                st = os.stat(self.journal_path, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) == cache.inode \
                    and st.st_size >= cache.offset:
                if st.st_size > cache.offset:
                    self._read_tail(cache, st.st_size)
                return cache
            self._forget()
        elif cache is not None:
            # Opened anew under the lock, every time: on NFS an open() revalidates what the
            # client caches of the file (close-to-open consistency), which a descriptor kept
            # open does not, so another machine's append could go unseen.
            try:
                fd = self._open_journal()
            except FileNotFoundError:
                fd = None
            st = os.fstat(fd) if fd is not None else None
            if fd is not None and st is not None and (st.st_dev, st.st_ino) == cache.inode \
                    and st.st_size >= cache.offset:
                os.close(cache.fd)
                cache.fd = fd
                if st.st_size > cache.offset:
                    self._read_tail(cache, st.st_size)
                return cache
            if fd is not None:
                os.close(fd)
            self._forget()
        return self._load()

    def _on_local_disk(self) -> bool:
        if self._local is None:
            self._local = known_local(self.folder)
        return self._local

    def _open_journal(self) -> int:
        try:
            return open_nofollow(self.journal_path, os.O_RDWR | os.O_APPEND)
        except ValueError as err:  # LinkRefused: someone left a link where the journal is
            raise StoreError(str(err)) from None

    def _read_tail(self, cache: _Cache, size: int) -> None:
        try:
            data = os.pread(cache.fd, size - cache.offset, cache.offset)
            lines, used = parse_lines(data, self.journal_path)
            for line in lines:
                apply_line(cache.state, line, cache.touched)
                self._note(runs_in_line(line))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            self._forget()
            raise self._bad_line(err) from None
        except BaseException:
            self._forget()
            raise
        cache.offset += used
        if used < len(data):  # a line a crash cut short: nobody else writes while we hold
            os.ftruncate(cache.fd, cache.offset)  # the lock, so cut it off now

    def _load(self) -> _Cache | None:
        """Under the lock: read the snapshot and the whole journal (``None``: no state yet)."""
        self._changed = None
        snapshot = self._read_snapshot()
        if snapshot is None:
            return None
        state, generation, snapshot_bytes = snapshot
        try:
            fd = self._open_journal()
        except FileNotFoundError:  # a state written before journals, or never appended to
            fd = self._new_journal(generation)
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0)
            header, lines, used = self._journal_lines(data)
            if header != generation:
                if header is not None and header > generation:
                    raise StoreError(
                        f"{self.journal_path} is newer than {self.path}: the files were "
                        "edited or damaged; restore them, or use another output_dir")
                # Older: a crash between the snapshot's rename and the journal's; the
                # snapshot has all of it.
                os.close(fd)
                fd, lines = self._new_journal(generation), []
                data = os.pread(fd, os.fstat(fd).st_size, 0)
                used = len(data)
            touched: set[str] = set()
            watch_runs(state.runs.values(), touched)
            for line in lines:
                apply_line(state, line, touched)
            if used < len(data):
                os.ftruncate(fd, used)
            st = os.fstat(fd)
            start = data.find(b"\n") + 1  # after the header
            self._cache = _Cache(state, fd, (st.st_dev, st.st_ino), st.st_size, generation,
                                 snapshot_bytes, touched, start)
            return self._cache
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            os.close(fd)
            raise self._bad_line(err) from None
        except BaseException:
            os.close(fd)
            raise

    def _forget(self) -> None:
        cache, self._cache = self._cache, None
        if cache is not None:
            with contextlib.suppress(OSError):
                os.close(cache.fd)

    def _append(self, cache: _Cache, line: dict[str, Any], durable: bool) -> None:
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            written = os.write(cache.fd, data)
            if written != len(data):
                raise OSError(f"short write to the journal ({written} of {len(data)} bytes)")
            if durable:
                os.fsync(cache.fd)
        except OSError as err:
            # Nothing of this change is kept: a partial line is cut off by the next writer.
            raise ExperimentFault(fault_message("the shared state", self.journal_path,
                                                disk_fault(err, ours=True) or str(err))) from err
        cache.offset += len(data)

    def _new_journal(self, generation: int) -> int:
        """Replace the journal by an empty one of ``generation``; returns it open."""
        header = json.dumps({"format": _JOURNAL_FORMAT, "generation": generation}) + "\n"
        self._write_whole(self.journal_path, header)
        return self._open_journal()

    def _write_whole(self, path: Path, text: str) -> None:
        """Replace ``path`` by ``text`` durably, through the one write path: a fresh name in
        the folder held by descriptor, reached from ``output_dir`` without a link, renamed
        over ``path`` (storage/write_path.py)."""
        try:
            write_atomic(path, text, fsync=True)
        except ValueError as err:  # LinkRefused: a link on the way
            raise StoreError(str(err)) from None
        except OSError as err:
            raise ExperimentFault(fault_message("the shared state", self.path,
                                                disk_fault(err, ours=True) or str(err))) from err

    def _compact(self, state: ExperimentState, generation: int) -> None:
        """Write ``state`` whole as the snapshot of ``generation`` and start its journal."""
        doc = state.to_json()
        doc["generation"] = generation
        text = json.dumps(doc)  # one C-encoded write, not many small
        self._write_whole(self.path, text)
        try:
            fd = self._new_journal(generation)
            fsync_dir(self.folder)
        except OSError as err:
            self._forget()
            raise ExperimentFault(fault_message("the shared state", self.path,
                                                disk_fault(err, ours=True) or str(err))) from err
        touched = self._cache.touched if self._cache is not None else set()
        self._forget()
        watch_runs(state.runs.values(), touched)
        st = os.fstat(fd)
        self._cache = _Cache(state, fd, (st.st_dev, st.st_ino), st.st_size, generation,
                             len(text), touched, st.st_size)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if not self._folder_made:
            try:
                os.close(open_folder(self.folder))  # made; never through a link
            except OSError as err:
                raise ExperimentFault(fault_message(
                    "the shared state", self.folder, disk_fault(err, ours=True) or str(err))
                ) from err
            self._folder_made = True
        try:
            self._lock.acquire()
        except FileNotFoundError:  # the folder went since: make it again, once
            self._folder_made = False
            with self._locked():
                yield
            return
        except LockUnsupported:  # not a fault a re-run fixes: its own message says what does
            raise
        except OSError as err:  # the folder became read-only or full: say which, once
            raise ExperimentFault(fault_message("the shared state's lock", self._lock_path,
                                                disk_fault(err, ours=True) or str(err))) from err
        try:
            yield
        finally:
            self._lock.release()
