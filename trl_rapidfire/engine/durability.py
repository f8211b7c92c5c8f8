"""Writing the volatile boundaries of runs that are stopped or leave this worker.

With ``checkpoint_every`` (:mod:`trl_rapidfire.config.cadence`) most boundaries are not written in
the run's turn. When a run with such a boundary is stopped, or the worker stops training
(the end of ``train()``, Ctrl-C, its launcher gone), its checkpoint is taken at the boundary
its ``train()`` is suspended at, and the shared state records its chunks as durable."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable

from ..shared_state.runs import RunStatus
from .coordination import Coordinator
from .records import RunSlot
from .turns import Turns

__all__ = ["make_durable", "write_stopped"]


def make_durable(turns: Turns, shared: Coordinator, slots: Iterable[RunSlot]) -> None:
    """Write the checkpoint of every run in ``slots`` whose boundary is volatile, wait for the
    writes, and record them in the shared state."""
    writes = [(slot, write) for slot in slots
              if (write := turns.make_durable(slot)) is not None]
    if writes:
        turns.open_writes()
        concurrent.futures.wait([write for _, write in writes])
        shared.mark_durable(writes)


def write_stopped(turns: Turns, shared: Coordinator) -> None:
    """Stopped runs with volatile boundaries here: their state is written now (a stop is a
    durable point, whoever resumes the run and wherever)."""
    stopped, shared.stopped_volatile = shared.stopped_volatile, []
    make_durable(turns, shared, [s for s in stopped if s.state.status == RunStatus.STOPPED])
