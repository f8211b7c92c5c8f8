"""Recording the chunks a worker trained: each is recorded in the shared state once its
checkpoint is on disk (by the background writer, in one fsync'd transaction), or at the next
claim when no checkpoint is written; a disk fault, a failed write or a lost claim is recorded
as what it is. Split from :mod:`.coordination` along that seam: the coordinator claims chunks,
this records them."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from ..shared_state.runs import RunStatus
from ..shared_state.store import StateStore, fail_claimed, finish_chunk, mark_durable, release
from ..shared_state.worker_info import WorkerInfo
from ..storage.faults import checkpoint_fault
from ..storage.names import UntrustedValue
from ..storage.schedule import ChunkRecord, ScheduleAppender
from .faults import FaultNote
from .policy_view import MovedRuns
from .records import (
    ClaimLost,
    DiskFault,
    PendingChunk,
    Recorded,
    Recording,
    RunSlot,
    StateUnwritable,
    WriteFailed,
    Written,
)

__all__ = ["ChunkRecords"]


class ChunkRecords:
    """The recording side of :class:`~.coordination.Coordinator` (one of its bases): the
    attributes declared here are the coordinator's."""

    store: StateStore
    worker: WorkerInfo
    schedule: list[ChunkRecord]
    moved: MovedRuns
    _rows: ScheduleAppender
    _fault: FaultNote
    _forget: Callable[[RunSlot], None]
    _commits: threading.Lock
    _pending: list[PendingChunk]  # chunks trained but not yet recorded, oldest first
    _settled: list[RunSlot]  # runs whose chunks were recorded: turns to end

    def _transaction(self, durable: bool = True
                     ) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError  # the coordinator's

    def sync(self, st: Any) -> None:
        raise NotImplementedError  # the coordinator's

    def _resync(self, slot: RunSlot) -> None:
        raise NotImplementedError  # the coordinator's

    def _wait_for_gang_record(self) -> None:
        raise NotImplementedError  # the gang side's

    def defer_finish(self, slot: RunSlot, record: ChunkRecord) -> None:
        """Have ``slot``'s chunk recorded once its checkpoint is on disk: by the background
        writer, right after the checkpoint (one fsync'd transaction per chunk, none on the
        switch path); with no checkpoint written, by the next claim."""
        write, slot.durability.write = slot.durability.write, None
        self.moved.note(slot.name)
        entry = PendingChunk(slot, record, complete=slot.outcome.finished,
                             chunks_total=len(slot.plan), durable=write is not None)
        self._pending.append(entry)
        if write is not None:
            entry.committed = concurrent.futures.Future()
            # Run by the writer thread once the checkpoint is whole (at once, here, if it is
            # already).
            write.add_done_callback(lambda done: self._commit(entry, done.exception()))

    def pending_chunks(self) -> Iterator[tuple[str, int]]:
        """(run, chunk number) of every chunk trained here and not recorded yet."""
        for entry in self._pending:
            yield entry.slot.name, entry.record.number

    def _commit(self, entry: PendingChunk, error: BaseException | None) -> None:
        """In the writer thread: record ``entry``'s chunk (or why it cannot be) durably."""
        with self._commits:
            try:
                with self.store.transaction() as st:
                    outcome = self._store_record(st, entry, error)
            except BaseException as exc:  # noqa: BLE001 - raised in the loop, not lost here
                outcome = StateUnwritable(exc)
            entry.outcome = outcome
            assert entry.committed is not None  # only an entry with a write is committed here
            entry.committed.set_result(None)

    def _store_record(self, st: Any, entry: PendingChunk, error: BaseException | None
                      ) -> Recording:
        """Inside a transaction: the chunk recorded as done, or released (a disk fault: the
        previous boundary stays on disk and recorded, a re-run trains the chunk again from
        there; nothing is failed), or the run failed (its checkpoint could not be written)."""
        name = entry.slot.name
        fault = checkpoint_fault(error)
        if fault is not None:
            release(st, name, self.worker.id)
            return DiskFault(fault)
        if error is not None:
            message = f"writing its checkpoint failed: {type(error).__name__}: {error}"
            fail_claimed(st, name, self.worker.id, message)
            return WriteFailed(message)
        if st.chunks_total.get(name) != entry.chunks_total:  # journalled only when replanned
            st.chunks_total[name] = entry.chunks_total
        if finish_chunk(st, name, self.worker.id, entry.record.number,
                        global_step=entry.record.end_step, complete=entry.complete,
                        durable=entry.durable):
            self._rows.append(entry.record)
            return Recorded(st.runs[name].chunks_done)
        return ClaimLost()

    def _settle(self) -> None:
        """Take in the chunks the writer recorded (``_commits`` held): this worker's view of
        each run moves on, and the runs' turns end at the next claim."""
        left = []
        for entry in self._pending:
            if entry.outcome is None:
                left.append(entry)
                continue
            slot = entry.slot
            match entry.outcome:
                case StateUnwritable(exception):  # as if raised here
                    self._pending = left + self._pending[self._pending.index(entry) + 1:]
                    raise exception
                case DiskFault(message):
                    self._fault.note(message)
                    continue
                case WriteFailed(error):
                    slot.outcome.error = error
                case Recorded(chunks_done):
                    self.schedule.append(entry.record)
                    slot.turn.local_chunks = chunks_done
                case ClaimLost():
                    warnings.warn(f"{slot.name}: this worker lost its claim on chunk "
                                  f"{entry.record.number} (lease expired); another worker "
                                  "redoes it.", RuntimeWarning, stacklevel=5)
                    slot.turn.local_chunks = -1
                    self._resync(slot)
            self._settled.append(slot)
        self._pending = left

    def _record_finishes(self, st: Any) -> list[RunSlot]:
        """Inside a transaction: record the chunks that have no checkpoint to wait for;
        returns the runs whose chunks are recorded since the last call (turns to end)."""
        for entry in self._pending:
            if entry.committed is None:
                entry.outcome = self._store_record(st, entry, None)
        self._settle()
        done, self._settled = self._settled, []
        return done

    def flush_finishes(self) -> list[RunSlot]:
        """Record every chunk trained here, waiting for its checkpoint (and for a gang chunk
        to be recorded by its last member); returns the runs whose turns ended."""
        self._wait_for_gang_record()
        # Outside every lock: the writer takes ``_commits`` to record.
        concurrent.futures.wait([e.committed for e in self._pending if e.committed])
        if not self._pending and not self._settled:
            return []
        with self._transaction() as st:
            slots = self._record_finishes(st)
            self.sync(st)
        return slots

    def mark_durable(self, writes: list[Written]) -> list[RunSlot]:
        """Each run's volatile chunks (up to ``chunks``, step ``step``) are on disk once its
        write is done: record that, durably, in one transaction (a run that moved on since is
        left as it is). The caller waited for the writes (``durability.make_durable``).

        A write refused for a link on its way (:class:`UntrustedValue`) concerns that run
        alone, the path named: a running run fails, as in its turn (returned, its ``train()``
        unwound here); a stopped one stays stopped (a stop cannot become a failure), said in a
        warning: resumable in this process, and a re-run continues it from its last durable
        boundary."""
        done, refused = [], []
        for slot, write, chunks, step in writes:
            error = write.exception()
            if error is None:
                done.append((slot.name, chunks, step))
            elif (fault := checkpoint_fault(error)) is not None:
                self._fault.note(fault)
            elif isinstance(error, UntrustedValue):
                refused.append((slot, f"writing its checkpoint failed: {error}"))
            else:
                raise error
        if not done and not refused:
            return []
        with self._transaction() as st:
            for name, chunks, step in done:
                mark_durable(st, name, self.worker.id, chunks, step)
            failed = []
            for slot, message in refused:
                record = st.runs.get(slot.name)
                if record is not None and record.status == RunStatus.RUNNING:
                    record.fail(message)
                    failed.append(slot)
                else:
                    warnings.warn(f"{slot.name}: {message}; it stays {slot.state.status.value}",
                                  RuntimeWarning, stacklevel=4)
            self.sync(st)
        for slot in failed:
            self._forget(slot)
        return failed

    def wait_for_a_write(self) -> bool:
        """Block until the oldest chunk waiting for its checkpoint is recorded; ``False`` if
        none waits."""
        for entry in self._pending:
            if entry.committed is not None:
                concurrent.futures.wait([entry.committed])
                return True
        return bool(self._pending)
