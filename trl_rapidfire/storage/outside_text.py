"""Text from outside the script, bounded before it is parsed.

Op tags, CLI values, inbox files, state files, journal lines and a search's stored params are
written by whoever can reach the tracking server or the experiment's folder. Python's JSON
parser recurses once per nesting level: a few kilobytes of ``[[[[...`` raise ``RecursionError``
(not ``ValueError``) from deep inside it, and a large file is read whole into memory. So every
such text is held to a size and a nesting limit first, checked by a scan that does not recurse,
and only then parsed; anything beyond is an :class:`OutsideTextError` (a ``ValueError``) that
names where the text came from and the limit.

Reading such a file without following a link is :mod:`.own_files`'s.
"""

from __future__ import annotations

import json
import re
import sys
from itertools import accumulate
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "NotJSON",
    "OP_TEXT_BYTES",
    "OutsideTextError",
    "STATE_BYTES",
    "SMALL_FILE_BYTES",
    "check_depth",
    "check_size",
    "loads",
    "nesting_depth",
]

OP_TEXT_BYTES = 8_000
"""An op's text (a run tag's value, a CLI argument, an inbox file): MLflow's own limit on a
tag value, which is the longest op a person can set."""

SMALL_FILE_BYTES = 64 * 1024
"""Small state files: ``alive.json``, ``experiment.json``, an inbox op file, a search's
stored params, ``train_output.json``."""

STATE_BYTES = 256 * 1024 * 1024
"""The shared state's snapshot or journal, a checkpoint's ``trainer_state.json``: they grow
with the number of runs and steps, so the bound is one no real experiment meets."""

MAX_DEPTH = 32
"""Nesting of JSON values. The deepest the package writes is a run's knobs inside a journal
line (about 7 levels); ops need 3."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class OutsideTextError(ValueError):
    """Text from outside the script is too large or too deeply nested to be parsed, or is not
    what it must be. The message names where it came from."""


class NotJSON(OutsideTextError):
    """Text within the bounds that is not JSON at all (where the parser stopped is said)."""


def nesting_depth(text: str) -> int:
    """How deep the JSON ``text``'s arrays and objects nest (0 for a scalar), without
    recursion; brackets inside strings do not count."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets))))


def check_size(text: str | bytes, *, what: str, max_bytes: int) -> None:
    """:class:`OutsideTextError` if ``text`` is longer than ``max_bytes``."""
    if len(text) > max_bytes:
        raise OutsideTextError(f"{what} is too long ({len(text):,} characters; at most "
                               f"{max_bytes:,}): it is refused unread")


def check_depth(text: str, *, what: str, max_depth: int = MAX_DEPTH) -> None:
    """:class:`OutsideTextError` if ``text`` nests deeper than ``max_depth``."""
    depth = nesting_depth(text)
    if depth > max_depth:
        raise OutsideTextError(f"{what} nests {depth} levels deep (at most {max_depth}): it "
                               "is refused unparsed")


def loads(text: str | bytes, *, what: str, max_bytes: int = OP_TEXT_BYTES,
          max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)`` once ``text`` is within ``max_bytes`` and ``max_depth``.

    Raises:
        OutsideTextError: too long, too deep, not UTF-8, or not JSON (the message names
            ``what`` and, for bad JSON, where in it the parser stopped).
    """
    check_size(text, what=what, max_bytes=max_bytes)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise OutsideTextError(f"{what} is not UTF-8 text ({err.reason} at byte "
                                   f"{err.start})") from None
    check_depth(text, what=what, max_depth=max_depth)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise NotJSON(f"{what} is not valid JSON ({err.msg} at line {err.lineno} "
                               f"column {err.colno})") from None
    except ValueError as err:  # Python's limit on the digits of an integer
        if "integer string conversion" in str(err):
            raise OutsideTextError(f"{what} holds an integer of more than "
                                   f"{sys.get_int_max_str_digits():,} digits") from None
        raise OutsideTextError(f"{what} cannot be read as JSON: {err}") from None
    except RecursionError:  # not reached within MAX_DEPTH; kept for callers' larger limits
        raise OutsideTextError(f"{what} nests too deeply to be parsed") from None
