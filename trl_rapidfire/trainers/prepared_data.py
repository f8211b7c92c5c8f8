"""One prepared dataset for the runs that would prepare it alike.

TRL's trainers format, tokenize and filter their datasets in ``_prepare_dataset``: seconds on a
real dataset, and the same work for every run whose preparation settings agree. Each kind's run
hooks name what its preparation reads (a key); the runs of one experiment share a memo, so the
first run with a key prepares and the others take its result."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["prepared_once"]


def prepared_once(memo: dict | None, key: Hashable, inputs: tuple[Any, ...],
                  prepare: Callable[[], Any]) -> Any:
    """``prepare()``'s result, made once per ``key`` in ``memo`` (``None``: no sharing, made
    every time). ``inputs`` are kept alive with the result: their ``id()``s are part of keys,
    and an id is unique only while its object lives."""
    if memo is None:
        return prepare()
    if key not in memo:
        memo[key] = (inputs, prepare())
    return memo[key][1]
