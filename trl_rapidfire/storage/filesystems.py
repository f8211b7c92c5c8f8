"""Which filesystem a folder is on, as far as caching across machines goes.

A descriptor kept open sees what other processes append to a file on a local filesystem (they
share the kernel's page cache), but not on NFS and other network filesystems, where only an
``open()`` revalidates what the client caches (close-to-open consistency). The shared state's
journal is therefore opened anew for every transaction there, and kept open on a filesystem
known to be local (an open and a close were a tenth of a one-step chunk's claim on the tiny
model).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOCAL_FILESYSTEMS", "known_local"]

# Filesystems whose files one kernel serves to every process that opens them. Anything else
# (nfs, cifs, fuse.*, lustre, ceph, 9p, ...) or an unknown answer counts as shared by machines.
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "zfs",
                               "overlay", "f2fs", "reiserfs", "jfs", "bcachefs", "ramfs"})

_MOUNTINFO = "/proc/self/mountinfo"
_MOUNTINFO_BYTES = 4 * 1024 * 1024  # a machine with thousands of mounts stays well under


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def known_local(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is on a filesystem known to be local (see the module's text);
    ``False`` when it cannot be told (no ``/proc``: another OS, a sandbox)."""
    try:
        with open(_MOUNTINFO, "rb") as fh:
            text = fh.read(_MOUNTINFO_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return False
    target = str(Path(folder).resolve())
    best, best_type = "", ""
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or sep + 1 >= len(fields):
            continue
        mount = _unescape(fields[4])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        # The longest mount point holding the folder; a later line of the same point
        # (mounted over) wins.
        if inside and len(mount) >= len(best):
            best, best_type = mount, fields[sep + 1]
    return best_type in LOCAL_FILESYSTEMS
