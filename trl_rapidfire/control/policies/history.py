"""A run's history as a policy reads it, and reading a metric from it at a chunk boundary.

Its own module so that both :mod:`.base` (the context and the policies) and :mod:`.rungs` (a
rung's runs kept sorted by their metric) import it one way: no import cycle between them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...shared_state.runs import RunStatus

__all__ = ["RunHistory", "chunk_values", "metric_at"]


@dataclass(frozen=True)
class RunHistory:
    """What a policy knows of one run.

    Attributes:
        name: the run's name.
        status: its status now.
        chunks_done: chunks trained so far.
        chunks_total: chunks in its plan.
        chunk_ends: the global step at the end of each chunk of its plan, in order.
        log: the run's logged entries (``trainer.state.log_history``: dicts with ``step``).
        knobs: its knob values.
        parent: the run it was cloned from, if any.
        training: a worker is training its next chunk right now (it has left its last
            boundary: a decision about that boundary comes too late to save the chunk).
    """

    name: str
    status: RunStatus
    chunks_done: int
    chunks_total: int
    chunk_ends: tuple[int, ...]
    log: tuple[Mapping[str, Any], ...] = ()
    knobs: Mapping[str, Any] = field(default_factory=dict)
    parent: str | None = None
    training: bool = False



def metric_at(history: RunHistory, metric: str, chunks: int) -> float | None:
    """The last value of ``metric`` (or ``eval_<metric>``) the run logged by the end of its
    chunk number ``chunks`` (1-based); ``None`` if it logged none by then. NaN is returned
    as NaN: the caller decides what it means."""
    if chunks <= 0 or chunks > len(history.chunk_ends):
        return None
    end = history.chunk_ends[chunks - 1]
    keys = (metric,) if metric.startswith("eval_") else (metric, f"eval_{metric}")
    value = None
    for entry in history.log:
        if entry.get("step", math.inf) > end:
            continue
        for key in keys:
            v = entry.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                value = float(v)
                break
    return value


def chunk_values(history: RunHistory, metric: str) -> dict[int, float]:
    """Step at the end of each finished chunk -> the last value of ``metric`` (or
    ``eval_<metric>``) logged within that chunk; chunks without one are left out, NaN kept.
    What Optuna calls a trial's intermediate values (the search and the pruner report them)."""
    ends = history.chunk_ends[:max(history.chunks_done, 0)]
    keys = (metric,) if metric.startswith("eval_") else (metric, f"eval_{metric}")
    out: dict[int, float] = {}
    for entry in history.log:
        step = entry.get("step")
        if not isinstance(step, (int, float)) or isinstance(step, bool) or step <= 0:
            continue
        chunk = bisect_left(ends, step)  # the first chunk whose end is at or after the step
        if chunk == len(ends):
            continue
        for key in keys:
            value = entry.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[ends[chunk]] = float(value)
                break
    return out
