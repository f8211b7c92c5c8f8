"""Append-only CSV logs of an experiment (``ops.csv``, ``search.csv``): a header with the
first row, each row appended whole in one write, and read back skipping what a crash cut
short."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["append_row", "read_rows"]


def append_row(path: str | os.PathLike, fields: Sequence[str], row: Mapping[str, Any]) -> None:
    """Append ``row`` (field -> value) to the log at ``path``, its header first if it is new."""
    path = Path(path)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    if not path.exists():
        writer.writeheader()
    writer.writerow(dict(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", newline="") as fh:
        fh.write(buf.getvalue())


def read_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of the log at ``path`` (none if it does not exist), oldest first."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))
