"""Faults of the experiment, as opposed to failures of a run.

A run fails when its own code or values fail (a NaN loss, a formatting function that raises, an
out-of-memory batch): the others train on, and the failed run stays failed. A disk that is full
or read-only is none of the run's doing: every run would fail the same way, and each has valid
checkpoints of its finished chunks. So a failure to write a checkpoint or the shared state
stops the whole experiment at that boundary with one message naming the path and the OS
error; nothing is marked failed, and a re-run, once the disk is fixed, continues exactly.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

__all__ = ["ExperimentFault", "checkpoint_fault", "disk_fault", "fault_message", "free_space"]

_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})
# Also faults when our own writes (checkpoints, the shared state) meet them; a run's own code
# meeting them (its formatting function opening a file) is that run's failure.
_OUR_ERRNOS = _DISK_ERRNOS | {errno.EACCES, errno.EPERM}
# What libraries that hide the OSError say instead (torch's zip writer, safetensors' Rust IO).
_DISK_WORDS = ("no space left on device", "read-only file system", "disk quota exceeded",
               "file write failed", "storagefull", "file too large", "input/output error")
# torch.save's writer on a nearly full disk: the C++ stream fails, and torch says only that
# (RuntimeError "basic_ios::clear: iostream error", or "[enforce fail at inline_container.cc]
# unexpected pos 64 vs 0" when the zip's end cannot be written), never which errno.
_TORCH_WRITER_WORDS = ("basic_ios::clear", "iostream error", "inline_container.cc",
                       "pytorchstreamwriter failed")


class ExperimentFault(RuntimeError):
    """The experiment stopped because its files cannot be written (disk full, read-only,
    no permission). Every finished chunk is kept; run the script again once it is fixed."""


def disk_fault(exc: BaseException, *, ours: bool = False) -> str | None:
    """A one-line description (``"[Errno 28] No space left on device: 'path'"``) if ``exc``,
    or an error it was raised from, is a disk fault; else ``None``.

    ``ours``: ``exc`` came from writing the experiment's own files, where a permission error
    is a fault too."""
    errnos = _OUR_ERRNOS if ours else _DISK_ERRNOS
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ExperimentFault):
            return str(current)
        if isinstance(current, OSError) and current.errno in errnos:
            text = f"[Errno {current.errno}] {current.strerror or os.strerror(current.errno)}"
            return f"{text}: {current.filename!r}" if current.filename else text
        text = str(current).lower()
        if any(word in text for word in _DISK_WORDS):
            return f"{type(current).__name__}: {str(current).strip().splitlines()[0][:300]}"
        if isinstance(current, RuntimeError) and any(w in text for w in _TORCH_WRITER_WORDS):
            first = str(current).strip().splitlines()[0][:300]
            return (f"torch could not write a file ({type(current).__name__}: {first}); "
                    "the disk is most likely full")
        current = current.__cause__ or current.__context__
    return None


def free_space(path: str | os.PathLike) -> str | None:
    """How much room is left on the filesystem of ``path`` (its nearest existing folder), as
    a person reads it (``"12.0 KiB free"``), or ``None`` if it cannot be told."""
    here = Path(path)
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        free: float = shutil.disk_usage(here).free  # divided down to the unit below
    except OSError:
        return None
    for unit in ("B", "KiB", "MiB", "GiB"):
        if free < 1024 or unit == "GiB":
            return f"{free:.0f} {unit} free" if unit == "B" else f"{free:.1f} {unit} free"
        free /= 1024
    return None


def fault_message(what: str, path: str | os.PathLike | None, detail: str) -> str:
    """The one message a person sees when the experiment stops for a disk fault."""
    where = f" {Path(path)}" if path is not None else ""
    room = free_space(path) if path is not None else None
    if room is not None:
        detail = f"{detail} ({room} there)"
    return (f"trl-rapidfire stopped the experiment: cannot write {what}{where}: {detail}. "
            "Every finished chunk is kept; free space (or make the folder writable) and run "
            "the script again to continue from the last chunk boundary.")


def checkpoint_fault(error: BaseException | None) -> str | None:
    """What to say when writing a checkpoint met a disk fault (the experiment's, not the
    run's); ``None`` when ``error`` is none or not one."""
    detail = disk_fault(error, ours=True) if error is not None else None
    if detail is None:
        return None
    return str(error) if isinstance(error, ExperimentFault) else fault_message(
        "the checkpoint", None, detail)
