"""Files in the experiment's folder, never reached through a link.

Whoever can write into ``output_dir`` could leave a symbolic link where the experiment keeps a
file (``ops.csv`` -> someone else's file) or a temporary name it will write
(``.schedule.csv.tmp-<pid>``). trl-rapidfire never makes links there, so every file it opens
itself is opened with ``O_NOFOLLOW``: a link in the last component is refused
(:class:`LinkRefused`, naming the path) instead of followed. Folders are checked separately
(:meth:`trl_rapidfire.storage.layout.Layout.check_links`): a folder link may stay inside
``output_dir``, never lead out of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Any

from .names import UntrustedValue
from .outside_text import MAX_DEPTH, SMALL_FILE_BYTES, OutsideTextError, loads

__all__ = ["LinkRefused", "append_text", "open_nofollow", "read_bytes", "read_json",
           "write_atomic"]


class LinkRefused(UntrustedValue):
    """A file the experiment keeps in its folder is a symbolic link (or not a regular file):
    it is not followed."""


def _refused(path: Path) -> LinkRefused:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return LinkRefused(f"{path} is a symbolic link (to {target}); trl-rapidfire never "
                       "follows a link where it keeps its own files. Remove the link and run "
                       "again.")


def open_nofollow(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC)``; a link at ``path`` is
    :class:`LinkRefused`, and so is anything but a regular file."""
    path = Path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _refused(path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(f"{path} is not a regular file; trl-rapidfire keeps a file there")
    if flags & os.O_NONBLOCK == 0:
        os.set_blocking(fd, True)
    return fd


def read_bytes(path: str | os.PathLike, *, max_bytes: int = SMALL_FILE_BYTES,
               what: str | None = None) -> bytes:
    """The bytes of the file ``path``, refused unread beyond ``max_bytes``.

    Raises:
        FileNotFoundError: there is none.
        LinkRefused: it is a link (or not a regular file).
        OutsideTextError: it is larger than ``max_bytes``.
    """
    fd = open_nofollow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise OutsideTextError(f"{what or path} is too large ({size:,} bytes; at most "
                                   f"{max_bytes:,}): it is refused unread")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew while it was read
        raise OutsideTextError(f"{what or path} is too large (over {max_bytes:,} bytes): it "
                               "is refused unread")
    return data


def read_json(path: str | os.PathLike, *, max_bytes: int = SMALL_FILE_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in the file ``path``, read as :func:`read_bytes` reads and parsed
    within ``max_depth`` (:func:`~trl_rapidfire.storage.outside_text.loads`); errors name the
    file."""
    return loads(read_bytes(path, max_bytes=max_bytes), what=str(path), max_bytes=max_bytes,
                 max_depth=max_depth)


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` to the file at ``path`` (made if missing) in one write."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8", newline="") as fh:
        fh.write(text)


def write_atomic(path: str | os.PathLike, text: str | bytes, *, fsync: bool = False) -> None:
    """Replace the file at ``path`` by ``text`` whole: written to a temporary name beside it
    (created afresh, never through a link someone left there), then renamed over it (which
    replaces a link at ``path`` itself, never its target)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a killed process with our pid, or a planted link
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
