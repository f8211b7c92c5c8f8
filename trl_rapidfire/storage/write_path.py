"""The one write path for every file under an experiment's ``output_dir``.

Whoever can write into ``output_dir`` could put a link where the experiment writes: a symbolic
link (``ops.csv`` -> a shell's rc file; ``.rapidfire/checkpoints/run-0`` -> a folder elsewhere,
even while a run trains) or a hard link (``ops.csv`` as a second name of a file outside, whose
text every append would then grow). So every file the package writes, appends to or replaces
below an experiment's root is reached the same way:

* every folder from the root down is opened by descriptor, ``O_NOFOLLOW`` (made when missing):
  a link there is :class:`LinkRefused`, naming it, never followed;
* the file is opened ``O_NOFOLLOW`` inside the last folder's descriptor, and a file opened for
  writing must be a regular file with one name (``st_nlink == 1``), else it is refused;
* a file written whole is written under a fresh name in that folder and renamed over its name
  by the same descriptor, so swapping a folder for a link meanwhile cannot redirect it;
* a folder that code of others writes by path (the Trainer's checkpoints, a final adapter) is
  :class:`FolderWrite`: a fresh private folder made by descriptor, handed to that code through
  the descriptor itself (``/proc/self/fd/<n>``), checked to hold no link when it returns, and
  renamed into place by the held parent's descriptor.

The roots are the experiments' folders (:func:`register_root`, done by
:class:`~trl_rapidfire.storage.layout.Layout`); a root itself may be a link (a user's
``output_dir`` often is), nothing below it may. A path below no registered root is written
the same way from its parent down.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import threading
from pathlib import Path

from .names import UntrustedValue

__all__ = ["BY_DESCRIPTOR", "FolderWrite", "LinkRefused", "hard_linked", "not_regular",
           "open_child", "open_folder", "open_for_write", "refused_link", "register_root",
           "replace_in", "same_folder"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOTS: set[Path] = set()
_ROOTS_LOCK = threading.Lock()
# Code of others reads and writes by this path (Linux): the descriptor, not a name.
BY_DESCRIPTOR = Path("/proc/self/fd")


class LinkRefused(UntrustedValue):
    """A file or folder the experiment writes in its folder is a link (symbolic or hard), not
    a regular file, or was moved while written: it is not written through."""


def refused_link(path: Path, target: str | None = None) -> LinkRefused:
    """The error for a symbolic link at ``path``, naming where it leads."""
    if target is None:
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
    return LinkRefused(f"{path} is a symbolic link (to {target}); trl-rapidfire never "
                       "follows a link where it keeps its own files. Remove the link and run "
                       "again.")


def not_regular(path: Path, mode: int) -> LinkRefused:
    """The error for something at ``path`` (of ``mode``) that is not a regular file."""
    kind = next((what for test, what in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder")) if test(mode)), "not a file")
    return LinkRefused(f"{path} is not a regular file ({kind}); trl-rapidfire keeps a file "
                       "there and never reads anything else in its place. Remove it and run "
                       "again.")


def hard_linked(path: Path, links: int) -> LinkRefused:
    """The error for a file at ``path`` that has ``links`` names (a hard link)."""
    return LinkRefused(f"{path} has {links} names (a hard link: the same file is elsewhere "
                       "too); trl-rapidfire writes only a file of its own there. Remove it and "
                       "run again.")


def register_root(output_dir: str | os.PathLike) -> None:
    """Make ``output_dir`` an experiment's root: every write below it walks down from it."""
    root = Path(os.path.abspath(output_dir))
    if root not in _ROOTS:
        with _ROOTS_LOCK:
            _ROOTS.add(root)


def _split(folder: Path) -> tuple[Path, tuple[str, ...]]:
    """The root ``folder`` lies in (the longest registered one) and the names below it;
    ``folder`` itself with none for a folder below no root."""
    folder = Path(os.path.abspath(folder))
    best: Path | None = None
    for root in tuple(_ROOTS):
        if (folder == root or root in folder.parents) and (
                best is None or len(root.parts) > len(best.parts)):
            best = root
    if best is None:
        return folder, ()
    return best, folder.relative_to(best).parts


def open_child(parent_fd: int, name: str, shown: Path, make: bool = True) -> int:
    """The folder ``name`` in the folder ``parent_fd`` (made if missing, when ``make``),
    opened without following a link (``shown``: its path, for the error)."""
    if make:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent_fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        # Linux says ENOTDIR for a link opened with O_DIRECTORY | O_NOFOLLOW: ask which.
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(name, dir_fd=parent_fd).st_mode):
                raise refused_link(shown, os.readlink(name, dir_fd=parent_fd)) from None
        raise LinkRefused(f"{shown} is not a folder; trl-rapidfire keeps a folder there. "
                          "Remove it and run again.") from None


def open_folder(folder: str | os.PathLike, *, make: bool = True) -> int:
    """A descriptor of ``folder``, reached from its experiment's root without following a
    link (the folders made when missing, unless not ``make``). The caller closes it.

    Raises:
        LinkRefused: a folder below the root is a link or not a folder (named).
        FileNotFoundError: one is missing and not ``make``.
    """
    root, names = _split(Path(folder))
    if make:
        os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    at = root
    try:
        for name in names:
            if name in ("..", "."):
                raise UntrustedValue(f"{folder} is not a folder below {root}")
            at = at / name
            inner = open_child(fd, name, at, make)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def same_folder(fd: int, folder: Path) -> bool:
    """Whether ``folder``, reached from its root without links, is still the folder ``fd``
    holds (not moved away, nor swapped for a link or another folder)."""
    try:
        now = open_folder(folder, make=False)
    except (OSError, UntrustedValue):
        return False
    try:
        a, b = os.fstat(fd), os.fstat(now)
    finally:
        os.close(now)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _checked_file(fd: int, path: Path, writing: bool) -> int:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise not_regular(path, st.st_mode)
    if writing and st.st_nlink != 1:
        os.close(fd)
        raise hard_linked(path, st.st_nlink)
    return fd


def open_for_write(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``open(path, flags)`` for writing, by :func:`open_folder`'s descriptor of its folder and
    ``O_NOFOLLOW``: a link at ``path`` (symbolic, or a file with another name too) or anything
    but a regular file is :class:`LinkRefused`. The caller closes the descriptor."""
    path = Path(path)
    folder = open_folder(path.parent)
    try:
        try:
            fd = os.open(path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         mode, dir_fd=folder)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise refused_link(path) from None
            if err.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing)
                with contextlib.suppress(OSError):
                    raise not_regular(path, os.lstat(path.name, dir_fd=folder).st_mode
                                      ) from None
            raise
    finally:
        os.close(folder)
    fd = _checked_file(fd, path, writing=True)
    if flags & os.O_NONBLOCK == 0:
        os.set_blocking(fd, True)
    return fd


def replace_in(path: str | os.PathLike, data: bytes, *, fsync: bool = False) -> None:
    """Replace the file ``path`` by ``data`` whole: written under a fresh name in its folder
    (held by descriptor, reached as :func:`open_folder` does) and renamed over ``path`` by
    that descriptor. A link at ``path`` is replaced, its target untouched."""
    path = Path(path)
    folder = open_folder(path.parent)
    tmp = f".{path.name}.tmp-{os.getpid()}"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)  # a killed process's leftover, or a planted link
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644, dir_fd=folder)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                if fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)


class FolderWrite:
    """A folder written by code that takes a path (the Trainer's ``save_model``,
    ``torch.save``), made to appear whole at ``target``.

    A fresh folder with an unguessable name (mode 0o700) is made by descriptor in ``target``'s
    parent, itself held by descriptor (:func:`open_folder`). The writer is handed
    :attr:`path`, which reaches the fresh folder through its descriptor, so a folder above
    swapped for a link meanwhile cannot redirect a byte. :meth:`commit` then checks what was
    written (no link, every file of one name), renames it to ``target`` by the parent's
    descriptor, and checks that parent is still where the experiment keeps it: a swap is
    :class:`LinkRefused` naming the folder."""

    def __init__(self, target: str | os.PathLike) -> None:
        self.target = Path(target)
        self.name = f".tmp-{self.target.name}-{secrets.token_hex(6)}-{os.getpid()}"
        self.parent = open_folder(self.target.parent)
        try:
            os.mkdir(self.name, 0o700, dir_fd=self.parent)
            self.fd = os.open(self.name, _DIR_FLAGS, dir_fd=self.parent)
        except BaseException:
            os.close(self.parent)
            raise

    @property
    def path(self) -> Path:
        """Where the writer writes: the fresh folder, by its descriptor where the system
        names descriptors (Linux), else by name."""
        return self.by_descriptor(self.fd, self.target.parent / self.name)

    @staticmethod
    def by_descriptor(fd: int, folder: Path) -> Path:
        """A path that reaches the folder ``fd`` holds through the descriptor itself (Linux's
        ``/proc/self/fd/<n>``), whatever is done to the names above it meanwhile; ``folder``
        (its name) where the system has no such path."""
        return BY_DESCRIPTOR / str(fd) if BY_DESCRIPTOR.is_dir() else folder

    def _check_tree(self, single_names: bool) -> None:
        st = os.lstat(self.name, dir_fd=self.parent)
        own = os.fstat(self.fd)
        if (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino):
            raise LinkRefused(f"{self.target.parent / self.name} was replaced while it was "
                              "written; nothing of it is kept.")
        for top, dirs, files, at in os.fwalk(dir_fd=self.fd):
            for name in dirs + files:
                shown = self.target / top / name
                entry = os.stat(name, dir_fd=at, follow_symlinks=False)
                if stat.S_ISLNK(entry.st_mode):
                    raise refused_link(shown, os.readlink(name, dir_fd=at))
                if single_names and stat.S_ISREG(entry.st_mode) and entry.st_nlink != 1:
                    raise hard_linked(shown, entry.st_nlink)
                if stat.S_ISREG(entry.st_mode):
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
                    try:
                        os.fsync(fd)  # on disk before the rename makes the folder visible
                    finally:
                        os.close(fd)

    def commit(self, *, single_names: bool = True) -> Path:
        """Check what was written, rename it to ``target`` (replacing one there), and return
        ``target``. ``single_names=False``: files may have other names (a folder made of
        hard links to a checkpoint on purpose)."""
        try:
            self._check_tree(single_names)
            os.fsync(self.fd)
            name, trash = self.target.name, None
            try:
                os.lstat(name, dir_fd=self.parent)
                trash = f".trash-{name}-{secrets.token_hex(8)}"
                os.rename(name, trash, src_dir_fd=self.parent, dst_dir_fd=self.parent)
            except FileNotFoundError:
                pass
            os.rename(self.name, name, src_dir_fd=self.parent, dst_dir_fd=self.parent)
            os.fsync(self.parent)
            if trash is not None:
                shutil.rmtree(trash, dir_fd=self.parent, ignore_errors=True)
            if not same_folder(self.parent, self.target.parent):
                raise LinkRefused(f"{self.target.parent} was moved or replaced (by a link?) "
                                  f"while {name} was written in it; trl-rapidfire writes only "
                                  "inside the experiment's folder. Put it back and run again.")
            self._remove_stale()
            return self.target
        except BaseException:
            self.discard()
            raise
        finally:
            self.close()

    def _remove_stale(self) -> None:
        # Attempts of processes killed while writing this folder: it is whole now.
        prefix, pid = f".tmp-{self.target.name}-", str(os.getpid())
        for name in os.listdir(self.parent):
            if name.startswith(prefix) and name.rsplit("-", 1)[-1] != pid:
                shutil.rmtree(name, dir_fd=self.parent, ignore_errors=True)

    def discard(self) -> None:
        """Remove what was written (the target is as it was)."""
        with contextlib.suppress(OSError):
            shutil.rmtree(self.name, dir_fd=self.parent, ignore_errors=True)
        self.close()

    def close(self) -> None:
        """Let go of the descriptors (idempotent)."""
        for attr in ("fd", "parent"):
            fd = getattr(self, attr, -1)
            if fd >= 0:
                setattr(self, attr, -1)
                with contextlib.suppress(OSError):
                    os.close(fd)
