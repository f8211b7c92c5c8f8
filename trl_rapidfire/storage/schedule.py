"""The record of what was trained when: one row per finished chunk.

``trainer.schedule`` holds the rows in memory and ``<output_dir>/schedule.csv`` on disk: the
header is written atomically when the experiment starts and each finished chunk appends one
line with a single write (cheap enough for every chunk; a crash can at most cut the last line,
which :func:`read_schedule_csv` skips). Later tools draw the experiment's timeline from it.
Its times are ISO-8601 UTC text (see :mod:`.csv_logs`; older files' float seconds still read).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .csv_logs import read_csv_rows, utc_seconds, utc_text, whole_micros
from .names import is_run_name
from .outside_text import STATE_BYTES
from .own_files import open_nofollow, read_bytes, write_atomic

__all__ = ["ChunkRecord", "Handoffs", "ScheduleAppender", "read_schedule_csv",
           "write_schedule_csv"]


@dataclass(frozen=True)
class ChunkRecord:
    """One chunk of one run, as it was trained.

    Attributes:
        run: run name.
        epoch: epoch of the chunk (0-based).
        chunk: the chunk's index within its epoch (0-based).
        number: the chunk's index over the whole run (0-based).
        worker: which worker trained it.
        start_time, end_time: wall-clock seconds since the epoch (``time.time()``), to the
            microsecond (what ``schedule.csv`` keeps: a record equals its row read back).
        start_step, end_step: the run's optimizer steps ``[start_step, end_step)``.
    """

    run: str
    epoch: int
    chunk: int
    number: int
    worker: int
    start_time: float
    end_time: float
    start_step: int
    end_step: int

    def __post_init__(self) -> None:
        for name in _TIMES:
            object.__setattr__(self, name, whole_micros(getattr(self, name)))

    @property
    def steps(self) -> int:
        return self.end_step - self.start_step

    @property
    def seconds(self) -> float:
        return self.end_time - self.start_time


_FIELDS = [f.name for f in dataclasses.fields(ChunkRecord)]
_TIMES = ("start_time", "end_time")


def _cells(record: ChunkRecord) -> list[Any]:
    """The row of ``record``: its fields (times as text), then its steps."""
    return [utc_text(getattr(record, name)) if name in _TIMES else getattr(record, name)
            for name in _FIELDS] + [record.steps]


def write_schedule_csv(records: Sequence[ChunkRecord], path: str | os.PathLike) -> None:
    """Write ``records`` as CSV to ``path`` atomically (temp file, then rename)."""
    path = Path(path)  # its folders made by write_atomic, never through a link
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(_FIELDS + ["steps"])
    writer.writerows(_cells(r) for r in records)
    write_atomic(path, buf.getvalue())


def _csv_row_text(record: ChunkRecord) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(_cells(record))
    return buf.getvalue()


# A run name the csv module writes as it is (QUOTE_MINIMAL quotes a cell holding the
# delimiter, the quote character or a line break).
_PLAIN_CELL = re.compile(r"[^,\"\r\n]+")


def _row_text(record: ChunkRecord) -> str:
    """``record``'s line, exactly as :func:`_csv_row_text` writes it: one format of the
    integers and times instead of a csv writer over a list per chunk (a chunk's end runs on
    caches its step just filled; the writer's calls were most of its cost)."""
    r = record
    if _PLAIN_CELL.fullmatch(r.run) is None or not _all_int(r):
        return _csv_row_text(r)
    return (f"{r.run},{r.epoch},{r.chunk},{r.number},{r.worker},{utc_text(r.start_time)},"
            f"{utc_text(r.end_time)},{r.start_step},{r.end_step},{r.end_step - r.start_step}\n")


def _all_int(r: ChunkRecord) -> bool:
    return set(map(type, (r.epoch, r.chunk, r.number, r.worker, r.start_step,
                          r.end_step))) == {int}


class ScheduleAppender:
    """Appends rows to a schedule file through one descriptor kept open.

    A row is appended at every chunk's end: opening and closing the file for each cost more
    than the row (~0.1 ms, a tenth of what a one-step chunk costs besides its step on the tiny
    model). The descriptor is opened afresh when the path no longer names its file (another
    worker, registering, rewrote the schedule whole) and never through a link.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) the descriptor is of

    def append(self, record: ChunkRecord) -> None:
        """Append ``record`` in one write (a reader sees whole lines)."""
        data = _row_text(record).encode("utf-8")
        try:
            st = os.stat(self.path, follow_symlinks=False)
            here = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            here = None
        if self._fd is None or here != self._file:
            self.close()
            self._fd = open_nofollow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            st = os.fstat(self._fd)
            self._file = (st.st_dev, st.st_ino)
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        fd, self._fd, self._file = self._fd, None, None
        if fd is not None:
            os.close(fd)


def read_schedule_csv(path: str | os.PathLike) -> list[ChunkRecord]:
    """Read back a schedule file; a last line cut short by a crash is skipped, and so is a
    row whose run is not a run name (the file is in the experiment's folder, which others may
    write to: its names must not become paths). A chunk trained twice (its first training was
    volatile and lost with a crashed worker, see :mod:`trl_rapidfire.config.cadence`) keeps its last
    row, in that row's place."""
    types = {f.name: f.type for f in dataclasses.fields(ChunkRecord)}
    out = []
    text = read_bytes(path, max_bytes=STATE_BYTES).decode("utf-8", errors="replace")
    for row in read_csv_rows(text, str(path)):
        try:
            # Each value has its own field's type, read from the dataclass above.
            kwargs: dict[str, Any] = {}
            for name in _FIELDS:
                tp = types[name]
                kwargs[name] = (
                    int(row[name]) if tp in (int, "int")
                    else utc_seconds(row[name]) if name in _TIMES
                    else row[name]
                )
        except (TypeError, ValueError):
            continue  # an incomplete line
        if is_run_name(kwargs["run"]):
            out.append(ChunkRecord(**kwargs))
    last = {(r.run, r.number): i for i, r in enumerate(out)}
    return out if len(last) == len(out) else [out[i] for i in sorted(last.values())]


@dataclass(frozen=True)
class Handoffs:
    """How long one worker's device sat between chunks, from its schedule rows: what a user
    pays for switching runs (the gap between one chunk's end and the next chunk's start).

    Attributes:
        gaps: seconds between consecutive chunks, in time order.
        busy: seconds inside chunks, over all of them.
        chunks: how many chunks.
    """

    gaps: tuple[float, ...]
    busy: float
    chunks: int

    @property
    def share(self) -> float:
        """Switching as a fraction of chunk time."""
        return sum(self.gaps) / self.busy if self.busy else 0.0

    @property
    def mean_gap(self) -> float:
        return sum(self.gaps) / len(self.gaps) if self.gaps else 0.0

    @classmethod
    def of(cls, records: Sequence[ChunkRecord], worker: int = 0) -> Handoffs:
        """The hand-offs of ``worker``'s chunks among ``records``."""
        mine = sorted((r for r in records if r.worker == worker), key=lambda r: r.start_time)
        gaps = tuple(b.start_time - a.end_time for a, b in zip(mine, mine[1:]))
        return cls(gaps, sum(r.end_time - r.start_time for r in mine), len(mine))
