"""Writing the volatile boundaries of runs that are stopped or leave this worker.

With ``checkpoint_every`` (:mod:`trl_rapidfire.config.cadence`) most boundaries are not written in
the run's turn. When a run with such a boundary is stopped, or the worker stops training
(the end of ``train()``, Ctrl-C, its launcher gone), its checkpoint is taken at the boundary
its ``train()`` is suspended at, and the shared state records its chunks as durable."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable

from ..shared_state.runs import RunStatus
from ..storage.names import UntrustedValue
from .coordination import Coordinator
from .records import RunSlot, Written
from .turns import Turns

__all__ = ["make_durable", "write_stopped"]


def make_durable(turns: Turns, shared: Coordinator, slots: Iterable[RunSlot]) -> list[RunSlot]:
    """Write the checkpoint of every run in ``slots`` whose boundary is volatile, wait for the
    writes (and for the stopped runs' writes still going), and record them in the shared
    state. Returns the runs that failed for a link on their write's way (the others go on)."""
    writes = [_written(slot, write) for slot in slots
              if (write := _write(turns, slot)) is not None]
    writes, turns.stopped_writes = writes + turns.stopped_writes, []
    if not writes:
        return []
    turns.open_writes()
    concurrent.futures.wait([write for _, write, _, _ in writes])
    return shared.mark_durable(writes)


def write_stopped(turns: Turns, shared: Coordinator) -> list[RunSlot]:
    """Stopped runs with volatile boundaries here: their state is written (a stop is a
    durable point, whoever resumes the run and wherever).

    Written on the writer thread while the next chunk trains, and recorded as durable at a
    later boundary once done (at the latest when the runs leave this worker, see
    :func:`make_durable`): waiting for each stop's write and its fsync'd record in the loop
    cost ~24 ms a stop on the tiny model, and successive halving stops most runs. Until it is
    recorded, a crash loses nothing but the stopped run's volatile chunks, which a re-run
    trains again exactly. Returns the runs that failed for a link on their write's way."""
    stopped, shared.stopped_volatile = shared.stopped_volatile, []
    for slot in stopped:
        if slot.state.status == RunStatus.STOPPED:
            write = _write(turns, slot)
            if write is not None:
                turns.stopped_writes.append(_written(slot, write))
    done = [entry for entry in turns.stopped_writes if entry[1].done()]
    if not done:
        return []
    turns.stopped_writes = [entry for entry in turns.stopped_writes if entry not in done]
    return shared.mark_durable(done)


def _write(turns: Turns, slot: RunSlot) -> concurrent.futures.Future | None:
    """``turns.make_durable(slot)``, a link refused on the way made the write's outcome (its
    run fails alone in :meth:`Coordinator.mark_durable`, as a refused write on the writer
    thread does), not an error that stops every run."""
    try:
        return turns.make_durable(slot)
    except UntrustedValue as err:
        refused: concurrent.futures.Future = concurrent.futures.Future()
        refused.set_exception(err)
        return refused


def _written(slot: RunSlot, write: concurrent.futures.Future) -> Written:
    return slot, write, slot.state.chunks_done, slot.state.global_step
