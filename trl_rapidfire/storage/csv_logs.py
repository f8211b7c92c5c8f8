"""Append-only CSV logs of an experiment (``ops.csv``, ``search.csv``): a header with the
first row, each row appended whole in one write, and read back skipping what a crash cut
short."""

from __future__ import annotations

import csv
import io
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .outside_text import STATE_BYTES
from .own_files import append_text, read_bytes

__all__ = ["append_row", "read_csv_rows", "read_rows"]


def append_row(path: str | os.PathLike, fields: Sequence[str], row: Mapping[str, Any]) -> None:
    """Append ``row`` (field -> value) to the log at ``path``, its header first if it is new."""
    path = Path(path)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    if not os.path.lexists(path):
        writer.writeheader()
    writer.writerow(dict(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    append_text(path, buf.getvalue())  # never through a link left at its path


def read_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of the log at ``path`` (none if it does not exist), oldest first."""
    try:
        data = read_bytes(path, max_bytes=STATE_BYTES)
    except FileNotFoundError:
        return []
    return read_csv_rows(data.decode("utf-8", errors="replace"), str(path))


def read_csv_rows(text: str, where: str) -> list[dict[str, str]]:
    """The rows of the CSV ``text`` (read from ``where``); a row with a field beyond the
    ``csv`` module's limit ends the reading there (what follows is not a log we wrote)."""
    rows = []
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            rows.append(row)
    except csv.Error as err:
        warnings.warn(f"{where}: {err}; the rows after line {reader.line_num} are not read",
                      RuntimeWarning, stacklevel=3)
    return rows
