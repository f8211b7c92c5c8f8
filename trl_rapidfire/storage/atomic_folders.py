"""Folders that appear on disk whole or not at all.

A folder is written under a dot-prefixed temporary name beside its final one, its files are
fsynced, and it is renamed into place; an old folder of that name is first moved aside under
another dot-prefixed name. So a crash never leaves a half-written folder, or half of a removed
one, under a name where a complete one is expected, and readers skip every dot-prefixed name.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from pathlib import Path

from .write_path import open_folder

__all__ = [
    "TMP_PREFIX",
    "TRASH_PREFIX",
    "fsync_dir",
    "fsync_file",
    "remove_folder",
    "replace_folder",
]

# Dot-prefixed names are never entries: folders being written, and old ones being removed.
TMP_PREFIX = ".tmp-"
"""Name prefix of a folder still being written."""
TRASH_PREFIX = ".trash-"
"""Name prefix of an old folder moved aside to be removed."""


def fsync_file(path: Path) -> None:
    """Flush the file at ``path`` to disk (opened read-only, never through a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush the folder ``path`` itself (the names in it) to disk."""
    # Makes renames and new names durable; not possible (nor needed) on Windows.
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_folder(folder: Path) -> None:
    """Remove ``folder`` so that no half-deleted entry is ever left under its name: renamed
    aside, then removed, by the descriptor of its parent (reached from the experiment's root
    without a link, write_path.py); a link there is removed, never what it leads to."""
    try:
        parent = open_folder(folder.parent, make=False)
    except FileNotFoundError:
        return
    try:
        trash = f"{TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex}"
        try:
            os.rename(folder.name, trash, src_dir_fd=parent, dst_dir_fd=parent)
        except FileNotFoundError:
            return
        _remove_in(parent, trash)
    finally:
        os.close(parent)


def _remove_in(parent: int, name: str) -> None:
    """Remove ``name`` in the folder ``parent``: a link itself, never what it leads to."""
    if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
        os.unlink(name, dir_fd=parent)
    else:
        shutil.rmtree(name, dir_fd=parent, ignore_errors=True)


def replace_folder(tmp: Path, folder: Path) -> None:
    """Rename the complete folder ``tmp`` (its files already on disk), a sibling of
    ``folder``, to ``folder``, replacing one that is there, and make the rename durable; the
    renames are made by the descriptor of their parent, reached from the experiment's root
    without a link (write_path.py). On failure ``folder`` is as it was."""
    if tmp.parent != folder.parent:
        raise ValueError(f"{tmp} is not beside {folder}")
    parent = open_folder(folder.parent)
    try:
        held = os.open(tmp.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=parent)
        try:
            os.fsync(held)
        finally:
            os.close(held)
        trash = None
        # A directory cannot be renamed over a non-empty one: move the old one aside first.
        if os.path.lexists(folder):
            trash = f"{TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex}"
            os.rename(folder.name, trash, src_dir_fd=parent, dst_dir_fd=parent)
        try:
            os.rename(tmp.name, folder.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            if trash is not None:
                os.rename(trash, folder.name, src_dir_fd=parent, dst_dir_fd=parent)
            raise
        os.fsync(parent)
        if trash is not None:
            _remove_in(parent, trash)
    finally:
        os.close(parent)
