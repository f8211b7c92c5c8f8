"""Files in the experiment's folder, never reached through a link.

Whoever can write into ``output_dir`` could leave a link where the experiment keeps a file
(``ops.csv`` -> someone else's file, symbolic or hard) or a temporary name it will write
(``.schedule.csv.tmp-<pid>``). trl-rapidfire never makes links there, so every file it opens
itself is opened with ``O_NOFOLLOW``: a link in the last component is refused
(:class:`LinkRefused`, naming the path) instead of followed.

Readers of others that take a path (safetensors, ``torch.load``) get the file as opened and
checked here (:func:`read_by_descriptor`), never its name.

Every write (:func:`append_text`, :func:`write_atomic`, :func:`open_nofollow` for writing) goes
through the one write path, :mod:`trl_rapidfire.storage.write_path`: the folders from the
experiment's root down are opened by descriptor without following a link, and a file opened
for writing must have one name (a hard link is refused). Reads only refuse a link at the file
itself; folders are checked by :meth:`trl_rapidfire.storage.layout.Layout.check_links`.

:func:`write_under` writes a file below a folder the caller names as the root (a run's
``generations/``) the same way, from that root down.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .names import UntrustedValue
from .outside_text import MAX_DEPTH, SMALL_FILE_BYTES, OutsideTextError, loads
from .write_path import (
    BY_DESCRIPTOR,
    LinkRefused,
    not_regular,
    open_child,
    open_for_write,
    refused_link,
    replace_in,
)

__all__ = ["LinkRefused", "append_text", "not_regular", "open_nofollow", "read_by_descriptor",
           "read_bytes", "read_json", "write_atomic", "write_under"]


def open_nofollow(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC)``; a link at ``path`` is
    :class:`LinkRefused`, and so is anything but a regular file. Opened for writing, it is
    :func:`~trl_rapidfire.storage.write_path.open_for_write`: its folder reached from the
    experiment's root without a link, and a file with another name (a hard link) refused."""
    if flags & (os.O_WRONLY | os.O_RDWR):
        # Every write: by the descriptor of its folder, reached from the experiment's root
        # without a link, and never to a file with another name (write_path.py).
        return open_for_write(path, flags, mode)
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer, forever; what was
        # opened is then checked by its descriptor, so a swap after any earlier look cannot
        # slip a FIFO, socket or device past the check.
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise refused_link(path) from None
        if err.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing, no reader)
            with contextlib.suppress(OSError):
                raise not_regular(path, os.lstat(path).st_mode) from None
        raise
    if not stat.S_ISREG(st_mode := os.fstat(fd).st_mode):
        os.close(fd)
        raise not_regular(path, st_mode)
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


@contextlib.contextmanager
def read_by_descriptor(path: str | os.PathLike) -> Iterator[str]:
    """For readers that take a path (safetensors' ``load_file``, ``torch.load``): the file
    ``path`` opened as :func:`open_nofollow` opens it (a link, a FIFO, a device refused, by the
    descriptor: nothing swapped in after the look gets through), handed over as
    ``/proc/self/fd/<n>``, which reopens that file whatever the name points to by then;
    closed after.

    Raises:
        FileNotFoundError: there is none.
        LinkRefused: it is a link, or not a regular file.
    """
    fd = open_nofollow(path, os.O_RDONLY)
    try:
        # Without /proc (not Linux): the name, checked just above.
        yield str(BY_DESCRIPTOR / str(fd)) if BY_DESCRIPTOR.is_dir() else str(path)
    finally:
        os.close(fd)


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` to the file at ``path`` (made if missing) in one write."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8", newline="") as fh:
        fh.write(text)


def write_atomic(path: str | os.PathLike, text: str | bytes, *, fsync: bool = False) -> None:
    """Replace the file at ``path`` by ``text`` whole: written to a temporary name beside it
    (created afresh, never through a link someone left there), then renamed over it (which
    replaces a link at ``path`` itself, never its target); the folder is held by descriptor
    throughout (:func:`~trl_rapidfire.storage.write_path.replace_in`)."""
    replace_in(path, text.encode("utf-8") if isinstance(text, str) else text, fsync=fsync)


def write_under(root: str | os.PathLike, path: str | os.PathLike, text: str | bytes) -> None:
    """Write the file ``path``, which lies below the folder ``root``, whole: the folders
    between them are made when missing and never followed if they are links
    (:class:`LinkRefused`, naming the first), the file is written to a fresh temporary name
    in its folder and renamed over ``path`` (a link at ``path`` is replaced, never
    followed). ``root`` itself is the caller's to have checked (a run's folder is, by
    :class:`~trl_rapidfire.storage.layout.Layout`).

    Raises:
        LinkRefused: a folder below ``root`` is a link or not a folder.
        UntrustedValue: ``path`` does not lie below ``root``.
    """
    root, path = Path(root), Path(path)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise UntrustedValue(f"{path} is not below {root}; refusing to write it") from None
    if not parts or any(p in ("..", ".") for p in parts):
        raise UntrustedValue(f"{path} is not a file below {root}; refusing to write it")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        at = root
        for name in parts[:-1]:
            at = at / name
            inner = open_child(fd, name, at)
            os.close(fd)
            fd = inner
        _write_in(fd, parts[-1], text)
    finally:
        os.close(fd)


def _write_in(folder_fd: int, name: str, text: str | bytes) -> None:
    tmp = f".{name}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=folder_fd)  # a leftover of a killed process, or a planted link
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644, dir_fd=folder_fd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder_fd)
        raise
