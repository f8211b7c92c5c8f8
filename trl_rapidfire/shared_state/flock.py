"""An exclusive lock on a file, between processes and between the threads of one process.

``flock`` excludes open file descriptions, so each thread holds its own descriptor of the lock
file, kept open from one acquisition to the next: ``filelock.FileLock`` opens and closes the
file at every acquisition, which was ~0.3 ms of every turn's claim on a 2-core machine. One
lock object per path and process (as ``FileLock(is_singleton=True)``), re-entrant per thread.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import weakref
from pathlib import Path

__all__ = ["Flock", "LockUnsupported", "flock_for"]

# What flock says on a filesystem that cannot lock (NFS mounted without lock support, some
# FUSE and Lustre mounts).
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


class LockUnsupported(OSError):
    """The filesystem of the experiment's folder cannot ``flock``: its workers' shared state
    (claims, records) would not be protected, so nothing trains."""

# Weak: a lock (and every thread's descriptor of it) goes with the last store using it.
_LOCKS: weakref.WeakValueDictionary[str, Flock] = weakref.WeakValueDictionary()
_LOCKS_GUARD = threading.Lock()


class _Descriptor:
    """A thread's open lock file; closed with the thread (its ``threading.local`` goes)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.depth = 0
        self.pid = os.getpid()  # a forked child shares the parent's description: not its lock

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class Flock:
    """Use :func:`flock_for`: one lock per path in a process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def acquire(self) -> None:
        """Block until this thread holds the lock (at once if it already does)."""
        held: _Descriptor | None = getattr(self._local, "held", None)
        if held is not None and held.pid != os.getpid():
            held.depth = 0  # closing the child's copy leaves the parent's lock alone
            held = self._local.held = None
        if held is not None and held.depth:
            held.depth += 1
            return
        while True:
            if held is None:
                held = self._local.held = _Descriptor(
                    # Never through a link someone left at the lock's path.
                    os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                            0o644))
            try:
                fcntl.flock(held.fd, fcntl.LOCK_EX)
            except OSError as err:
                if err.errno not in _NO_LOCKS:
                    raise
                held = self._local.held = None
                raise LockUnsupported(
                    err.errno, f"{self.path}: this filesystem cannot lock files "
                    f"({os.strerror(err.errno)}), and the workers' shared state needs a lock "
                    "that every process (and machine) sees. Put output_dir on a filesystem "
                    "that supports flock: a local disk for one machine; NFSv4, or Lustre "
                    "mounted with -o flock, for several.") from err
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            mine = os.fstat(held.fd)
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                held.depth = 1
                return
            # The lock file was removed (or replaced) since this thread opened it: others lock
            # the file now at the path.
            fcntl.flock(held.fd, fcntl.LOCK_UN)
            held = self._local.held = None

    def release(self) -> None:
        held: _Descriptor = self._local.held
        held.depth -= 1
        if held.depth == 0:
            fcntl.flock(held.fd, fcntl.LOCK_UN)


def flock_for(path: str | os.PathLike) -> Flock:
    """The process's lock on ``path`` (made at the first call)."""
    key = str(Path(path).absolute())
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = Flock(key)
        return lock
