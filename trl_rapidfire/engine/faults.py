"""Disk faults as the engine meets them: a write of ours that fails for want of disk (full,
read-only, gone) becomes an :class:`~trl_rapidfire.storage.faults.ExperimentFault` naming the
file, and the first one noted stops the experiment at the next boundary (a re-run continues
from the last recorded boundaries)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..storage.faults import ExperimentFault, disk_fault, fault_message

__all__ = ["FaultNote", "disk_faults"]


@contextlib.contextmanager
def disk_faults(what: str, path: Path) -> Iterator[None]:
    """Our own writes: a disk fault becomes an :class:`ExperimentFault` naming ``path``."""
    try:
        yield
    except ExperimentFault:
        raise
    except Exception as exc:
        detail = disk_fault(exc, ours=True)
        if detail is None:
            raise
        raise ExperimentFault(fault_message(what, path, detail)) from exc


class FaultNote:
    """The disk fault that stopped the experiment (faults.py): this engine trains no more; a
    re-run of the script continues from the last recorded boundaries. The first fault noted
    is the one reported."""

    def __init__(self) -> None:
        self.message: str | None = None

    def note(self, message: str | None) -> None:
        self.message = self.message or message

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """An :class:`ExperimentFault` raised in the body is noted, not raised."""
        try:
            yield
        except ExperimentFault as exc:
            self.note(str(exc))
