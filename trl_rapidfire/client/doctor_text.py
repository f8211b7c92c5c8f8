"""The doctor's outside text, read and shown within bounds: an accelerate config, a tracking
URI and a store's first bytes are anyone's text. Files are read only as far as needed and never
block (a FIFO put in place of one), YAML no deeper than accelerate's own, values shown escaped
and cut. Each check answers in :class:`Finding` lines, the screen's unit."""

from __future__ import annotations

import os
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MAX_CONFIG_DEPTH", "MAX_SHOWN_CHARS", "Finding", "printable"]

# accelerate's configs nest two levels (fsdp_config: {...}); PyYAML's composer recurses per
# level, so a few KiB of `[[[[` would end in RecursionError: deeper is refused before it builds.
MAX_CONFIG_DEPTH = 16
MAX_SHOWN_CHARS = 400  # one value on the screen: outside text beyond it is cut, not printed


@dataclass(frozen=True)
class Finding:
    """A line of the screen; ``fix`` says what to do about its ``problem`` (alone: a note)."""

    section: str
    label: str
    value: str
    problem: str | None = None
    fix: str | None = None


def _flag(section: str, label: str, value: str, bad: Any, problem: str, fix: str) -> Finding:
    return Finding(section, label, value, problem if bad else None, fix if bad else None)


def printable(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` safe for a terminal: control and format characters (ESC, NUL, newlines, bidi
    overrides) escaped as ``\\x1b``, and cut after ``limit`` characters; the YAML and the URI
    shown here are anyone's text, and a raw ESC can rewrite the screen."""
    shown = "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0]
                    in "CZ" and ch != " " else ch for ch in text[:limit])
    return f"{shown}... ({len(text):,} characters, cut)" if len(text) > limit else shown


def _kind(mode: int) -> str:
    """What a path that is not a regular file is, in words."""
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a file")):
        if test(mode):
            return what
    return "not a regular file"


def _read_head(path: Path, limit: int) -> bytes:
    """Up to ``limit`` + 1 bytes of the regular file ``path``. Opened non-blocking and checked
    after opening, so a FIFO put there (even after a stat) raises instead of blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
            raise ValueError(f"{_kind(mode)}, not a file")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read(limit + 1)
    finally:
        os.close(fd)


def _yaml_depth(text: str) -> None:
    """ValueError if the YAML ``text`` nests deeper than MAX_CONFIG_DEPTH, found from its
    parse events (the parser does not recurse, the composer building the values does)."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                mark = event.start_mark
                raise ValueError(f"nests over {MAX_CONFIG_DEPTH} levels deep (line "
                                 f"{mark.line + 1}, column {mark.column + 1}): not read")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _count(value: Any) -> str:
    """A count from the YAML as shown: a number, else only its kind (never a nested value)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else (
        "-" if value is None else f"a YAML {type(value).__name__}")
