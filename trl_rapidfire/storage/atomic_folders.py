"""Folders that appear on disk whole or not at all.

A folder is written under a dot-prefixed temporary name beside its final one, its files are
fsynced, and it is renamed into place; an old folder of that name is first moved aside under
another dot-prefixed name. So a crash never leaves a half-written folder, or half of a removed
one, under a name where a complete one is expected, and readers skip every dot-prefixed name.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

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
    """Flush the file at ``path`` to disk."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


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
    """Remove ``folder`` so that no half-deleted entry is ever left under its name."""
    trash = folder.with_name(f"{TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex}")
    try:
        os.replace(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def replace_folder(tmp: Path, folder: Path) -> None:
    """Rename the complete folder ``tmp`` (its files already on disk) to ``folder``, replacing
    one that is there, and make the rename durable. On failure ``folder`` is as it was."""
    fsync_dir(tmp)
    trash = None
    # A directory cannot be renamed over a non-empty one: move the old one aside first.
    if folder.exists():
        trash = folder.with_name(f"{TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex}")
        os.replace(folder, trash)
    try:
        os.replace(tmp, folder)
    except BaseException:
        if trash is not None:
            os.replace(trash, folder)
        raise
    fsync_dir(folder.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
