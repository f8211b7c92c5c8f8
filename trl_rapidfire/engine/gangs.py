"""A worker's part in an FSDP gang (a run trained by every worker of the launch at once):
waiting for the gang to form, and recording a gang chunk once every member has done its share.
Split from :mod:`.coordination` along that seam: the rest of the coordinator claims and records
chunks that one worker trains alone."""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any

from ..shared_state.gang_state import finish_gang_chunk, gang_ready
from ..shared_state.store import expire, release, renew
from ..shared_state.worker_info import WorkerInfo
from ..storage.schedule import ChunkRecord, ScheduleAppender
from .claims import GangWait
from .records import RunSlot

__all__ = ["GangMembership"]


class GangMembership:
    """The gang side of :class:`~.coordination.Coordinator` (its base): the attributes
    declared here are the coordinator's."""

    worker: WorkerInfo
    slots: dict[str, RunSlot]
    schedule: list[ChunkRecord]
    lease_seconds: float
    idle_wait: float
    gang_wait_seconds: float
    _rows: ScheduleAppender

    def _transaction(self, durable: bool = True
                     ) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError  # the coordinator's

    def sync(self, st: Any) -> None:
        raise NotImplementedError  # the coordinator's

    def _resync(self, slot: RunSlot) -> None:
        raise NotImplementedError  # the coordinator's

    def wait_for_gang(self, slot: RunSlot) -> GangWait:
        """Until every member of the gang has joined (they join as they finish the chunk
        they are training); ``BROKEN`` if the gang broke up (a member died), ``TIMED_OUT`` if
        it could not form within ``gang_wait_seconds`` (then the run fails, saying why)."""
        deadline = time.time() + self.gang_wait_seconds
        while True:
            with self._transaction(durable=False) as st:
                expire(st, now=time.time())
                ready = gang_ready(st)
                if ready is None or st.gang["run"] != slot.name:
                    return GangWait.BROKEN
                if not ready and time.time() > deadline:
                    joined = len(st.gang["members"])
                    release(st, slot.name, self.worker.id)
                    slot.outcome.error = (f"its gang of {slot.gang} workers did not form within "
                                  f"{self.gang_wait_seconds:g} s ({joined} joined): are all "
                                  "the launch's workers still in train()?")
                    st.runs[slot.name].fail(slot.outcome.error)
                    self.sync(st)
                    return GangWait.TIMED_OUT
                renew(st, slot.name, self.worker.id, now=time.time(),
                      lease_seconds=self.lease_seconds)
            if ready:
                return GangWait.READY
            time.sleep(self.idle_wait)

    def _wait_for_gang_record(self) -> None:
        """If this worker has done its share of a gang chunk, wait until the chunk is
        recorded (by the last member): ops act on recorded boundaries."""
        if not any(slot.gang for slot in self.slots.values()):
            return
        while True:
            with self._transaction(durable=False) as st:
                expire(st, now=time.time())  # a member that died ends the gang
                if st.gang is None or self.worker.id not in st.gang["done"]:
                    self.sync(st)  # the chunk as the last member recorded it
                    return
            time.sleep(self.idle_wait)

    def finish_gang_chunk(self, slot: RunSlot, record: ChunkRecord) -> None:
        """This member's share of the chunk (and of its checkpoint) is done: record it; the
        last member to get here records the chunk itself."""
        with self._transaction() as st:
            st.chunks_total[slot.name] = len(slot.plan)
            last = finish_gang_chunk(st, slot.name, self.worker.id, record.number,
                                     global_step=record.end_step, complete=slot.outcome.finished)
            if last:
                self._rows.append(record)
            if last is not False:
                self.schedule.append(record)
                slot.turn.local_chunks = (record.number + 1 if not slot.outcome.finished
                                          else len(slot.plan))
            else:
                warnings.warn(f"{slot.name}: its gang broke up during chunk {record.number}; "
                              "the chunk is trained again.", RuntimeWarning, stacklevel=4)
                slot.turn.local_chunks = -1
                self._resync(slot)
            self.sync(st)

