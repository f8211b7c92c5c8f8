"""Append-only CSV logs of an experiment (``ops.csv``, ``search.csv``): a header with the
first row, each row appended whole in one write, and read back skipping what a crash cut
short.

Text in a log is printable: a control or bidi character (NUL, ESC, a newline, U+202E RIGHT-TO-LEFT
OVERRIDE), which op text from a tag or an op file may hold, is written as its escape
(``\\x00``, ``\\u202e``; :func:`printable`), so the file, ``status`` and the report's
``summary.md`` show what was sent instead of being reordered or cut by it.

Times in ``ops.csv`` and ``schedule.csv`` are ISO-8601 UTC text (``2026-12-05T18:57:03.123456Z``):
a person opening the file reads when, not ``1796504223.1234567``. Files written before that hold
``time.time()`` floats; :func:`utc_seconds` reads both."""

from __future__ import annotations

import csv
import io
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .outside_text import STATE_BYTES
from .own_files import append_text, read_bytes

__all__ = ["append_row", "printable", "read_csv_rows", "read_rows", "utc_seconds", "utc_text",
           "whole_micros"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
_YEAR_10000 = 253_402_300_800  # seconds from the epoch to 10000-01-01


def _micros(seconds: float) -> int:
    # Exact (the float's own ratio of integers, not a float product): a time already whole in
    # microseconds maps to those microseconds again, so writing and reading are an identity.
    # Rounded half to even, as round() of a Fraction does (two rows a chunk: integer
    # arithmetic, not a Fraction's).
    numerator, denominator = seconds.as_integer_ratio()
    quotient, remainder = divmod(numerator * 1_000_000, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient & 1):
        quotient += 1
    return quotient


def whole_micros(seconds: float) -> float:
    """``seconds`` (``time.time()``) rounded to the microsecond: what its text in a log keeps,
    so that a record in memory equals the record read back from its file."""
    return _micros(seconds) / 1_000_000


def utc_text(seconds: float) -> str:
    """``time.time()`` seconds as ISO-8601 UTC text to the microsecond
    (``2026-12-05T18:57:03.123456Z``): microseconds, not milliseconds, because the gaps between
    chunks that ``schedule.csv`` is read for are a millisecond or two."""
    whole, micros = divmod(_micros(seconds), 1_000_000)
    if not 0 <= whole < _YEAR_10000:
        return (_EPOCH + (whole * 1_000_000 + micros) * _MICRO).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    t = time.gmtime(whole)  # the same text, without a datetime and strftime per row
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:"
            f"{t.tm_sec:02d}.{micros:06d}Z")


def utc_seconds(text: str) -> float:
    """The ``time.time()`` seconds of a log's time: ISO-8601 text (:func:`utc_text`; another
    offset is converted, none means UTC) or, in a file written before times were text, the
    number itself. Raises ``ValueError`` (``TypeError`` for a missing cell) for anything else: a
    row cut short by a crash, or a number no time is (``nan``, ``1e300``), which could not be
    written back."""
    if not isinstance(text, str):
        raise TypeError(f"a time is text, not {type(text).__name__}")
    try:
        seconds = float(text)
    except ValueError:
        when = datetime.fromisoformat(text.strip())
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = ((when - _EPOCH) // _MICRO) / 1_000_000
    try:  # also an ISO time past the year 9999 once in UTC (9999-12-31T23:59:59-01:00)
        utc_text(seconds)
    except (OverflowError, ValueError):
        raise ValueError(f"{text!r} is not a time") from None
    return seconds


def printable(text: str) -> str:
    """``text`` with every character that is not printable (control, format and bidi
    characters, line and paragraph separators, unassigned code points) written as its Python
    escape (``\\x1b``, ``\\u202e``); printable text comes back as it is. Applying it twice
    changes nothing more."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def append_row(path: str | os.PathLike, fields: Sequence[str], row: Mapping[str, Any]) -> None:
    """Append ``row`` (field -> value) to the log at ``path``, its header first if it is new;
    its text written :func:`printable`."""
    path = Path(path)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    if not os.path.lexists(path):
        writer.writeheader()
    writer.writerow({k: printable(v) if isinstance(v, str) else v for k, v in row.items()})
    # Its folders made, never followed if links; never through a link left at its path, nor
    # into a file that has another name too (own_files.py, write_path.py).
    append_text(path, buf.getvalue())


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
