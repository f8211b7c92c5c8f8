"""This worker's side of the experiment's shared state (:mod:`~trl_rapidfire.shared_state.store`):
putting its runs in, claiming the next chunk, waiting for a gang, recording finished chunks, and
keeping its view of every run the shared state's.

Each change is one ``store.transaction()``. What the engine does about the outcome (a run's turn
ends, clones are built) is the caller's: :meth:`Coordinator.claim` returns a :data:`Claim`, and
the methods that record chunks (:mod:`.chunk_records`, a base) return the runs whose turns
ended."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from ..shared_state.run_queue import RunQueue
from ..shared_state.runs import RunState, RunStatus
from ..shared_state.scheduler import Order
from ..shared_state.store import (
    StateStore,
    claim_next,
    expire,
    fail_claimed,
    handoff,
    release,
    roll_back,
)
from ..shared_state.worker_info import WorkerInfo
from ..storage.layout import Layout
from ..storage.schedule import ChunkRecord, ScheduleAppender, read_schedule_csv, write_schedule_csv
from .catch_up import catch_up_from_disk
from .chunk_records import ChunkRecords
from .claims import Claim, Done, GangWait, Retry, Turn, Wait, ready_call
from .faults import FaultNote
from .gangs import GangMembership
from .joining import check_alone, join, leave
from .lifetime import WallClock
from .policy_view import MovedRuns
from .records import (
    PendingChunk,
    RunSlot,
)

__all__ = ["Claim", "Coordinator", "Done", "GangWait", "Retry", "Turn", "Wait"]


class Coordinator(GangMembership, ChunkRecords):
    """Claims, leases, gangs and finished chunks of this worker, against the shared state.

    Args:
        store: the experiment's shared scheduler state.
        worker: who this worker is.
        slots: the engine's runs (shared, not copied).
        forget: lets go of a run the shared state says was deleted.
        clock: the experiment's training wall time (the first worker writes it).
        fault: where a disk fault met while recording is noted.
        schedule_path: ``schedule.csv``.
        lease_seconds: how long a claim lives without renewal.
        order: the scheduler's order (the same in every worker: each runs the same script).
    """

    def __init__(
        self, *, store: StateStore, worker: WorkerInfo, slots: dict[str, RunSlot],
        forget: Callable[[RunSlot], None], clock: WallClock, fault: FaultNote,
        schedule_path: Path, lease_seconds: float, order: Order = Order.EVEN,
    ) -> None:
        self.store = store
        self.worker = worker
        self.slots = slots
        self.schedule_path = schedule_path
        self._rows = ScheduleAppender(schedule_path)  # rows appended under the state's lock
        self.lease_seconds = lease_seconds
        self.idle_wait = 0.05
        self.gang_wait_seconds = 1800.0  # longest wait for a gang's members to join
        self.schedule: list[ChunkRecord] = []
        self.training_elsewhere: set[str] = set()  # runs other workers are training now
        self._forget = forget
        self._clock = clock
        self._fault = fault
        self._train_calls = 0  # run() calls so far (the same in every worker of a launch)
        self._claimed: tuple[str, int] | None = None
        # Chunks trained but not yet recorded, oldest first.
        self._pending: list[PendingChunk] = []
        # Held by the writer while it records a chunk, and by this worker's own transactions:
        # a transaction that takes the shared state's records as this worker's view (sync)
        # first takes in every chunk the writer recorded, never half of one.
        self._commits = threading.Lock()
        self._settled: list[RunSlot] = []  # runs whose chunks were recorded: turns to end
        # Runs with volatile chunks here that were stopped (by this worker's ops or another's):
        # their state is written at the next boundary of the loop.
        self.stopped_volatile: list[RunSlot] = []
        # What keeps a claim's cost from growing with the number of runs: the runs this worker
        # may claim, in the scheduler's order, and the runs whose record may differ from this
        # worker's view (None: any may); both fed by the shared state's change feed.
        self._queue = RunQueue(worker.id, order)
        self._unsynced: set[str] | None = None
        self.moved = MovedRuns()  # runs whose view moved since the policy last looked
        # Refused here, before anything is built on disk or in MLflow, if another process
        # trains the folder (see .joining); checked again under the lock by register().
        self.layout = Layout(schedule_path.parent)
        check_alone(self.layout, worker)

    # ------------------------------------------------------------------ this worker's view

    def register(self) -> tuple[dict[str, RunState], dict[str, dict[str, str]]]:
        """First ``run()``: put this process's runs in the shared state, or take the state
        that an earlier process (a killed experiment) or another worker left. Returns every
        run's record and the clones this process has yet to build."""
        with self.store.transaction() as st:
            join(self.layout, self.worker, st)  # or refused: another process trains here
            for slot in self.slots.values():
                if slot.gang:
                    st.gang_size[slot.name] = slot.gang
                if slot.name not in st.runs:
                    st.add_run(slot.name, len(slot.plan), slot.json_knobs())
                    if slot.trainer is None and not slot.planned:  # failed before training
                        st.runs[slot.name].fail(slot.outcome.error or "could not be set up")
            expire(st, now=time.time(), lease_seconds=self.lease_seconds)
            # Volatile chunks this process trained with an earlier trainer (one that met a
            # disk fault, say) went with it: this engine holds none of them yet.
            roll_back(st, self.worker.id)
            # Claims this worker left behind (an earlier trainer in this process that stopped
            # for a disk fault could not write their release): nobody is training them.
            for name in [n for n, c in st.claims.items() if c.worker == self.worker.id]:
                release(st, name, self.worker.id)
            records = {n: r.copy() for n, r in st.runs.items()}
            clones = self._unbuilt_clones(st)
            # Rows are appended under the same lock. Rewriting what is there drops a line a
            # crash cut short, so the next row starts on a line of its own.
            if self.schedule_path.exists():
                # Chunks lost with a gone worker (volatile, see expire) are not done any more:
                # their rows go, and the chunks get new ones when they are trained again.
                self.schedule = [r for r in read_schedule_csv(self.schedule_path)
                                 if r.run not in st.runs or r.number < st.runs[r.run].chunks_done]
            write_schedule_csv(self.schedule, self.schedule_path)
        return records, clones

    def adopt(self, slot: RunSlot, record: RunState) -> None:
        """Make this worker's view of ``slot`` the shared state's ``record``."""
        before, slot.state = slot.state, record
        self.moved.note(slot.name)
        if (record.status == RunStatus.STOPPED and before.status != RunStatus.STOPPED
                and slot.durability.volatile_chunks):
            self.stopped_volatile.append(slot)
        if record.status == RunStatus.DELETED and before.status != RunStatus.DELETED:
            self._forget(slot)
            return
        if record.status == RunStatus.FAILED and slot.outcome.error is None:
            slot.outcome.error = record.error
        if record.chunks_done > slot.turn.local_chunks:  # behind: another worker went on
            catch_up_from_disk(slot, record)

    def sync(self, st: Any) -> None:
        """Inside a transaction: take every run's record that changed as this worker's view."""
        elsewhere = {n for n, c in st.claims.items() if c.worker != self.worker.id}
        self.moved.note(*(elsewhere ^ self.training_elsewhere))
        self.training_elsewhere = elsewhere
        if self.worker.rank == 0 and self._clock.started is not None:
            st.wall_seconds = self._clock.seconds()
        self._take_changes(st)
        names, self._unsynced = (st.runs if self._unsynced is None else self._unsynced), set()
        for name in names:
            record, slot = st.runs.get(name), self.slots.get(name)
            if slot is None:
                if record is not None and record.status != RunStatus.DELETED:
                    self._unsynced.add(name)  # a run not built here yet: adopted once it is
                continue
            # An unchanged record of a run this worker is not behind on changes nothing.
            if record is not None and (record != slot.state
                                       or record.chunks_done > slot.turn.local_chunks):
                self.adopt(slot, record.copy())

    def _take_changes(self, st: Any) -> None:
        """Inside a transaction: the runs changed since the last look go into the claim queue
        and into what the next :meth:`sync` compares."""
        changed = self.store.take_changed_runs()
        self._queue.update(st, changed)
        if changed is None or self._unsynced is None:
            self._unsynced = None
        else:
            self._unsynced |= changed

    def _choose(self, st: Any, worker: str, finishing: Collection[str] = frozenset()
                ) -> str | None:
        """Inside a transaction: the run the scheduler gives ``worker`` next (see
        :func:`~trl_rapidfire.shared_state.store.choose`), from the queue brought up to date."""
        self._take_changes(st)
        return self._queue.pick(st, worker, finishing)

    def _resync(self, slot: RunSlot) -> None:
        """This worker's view of ``slot`` moved without its record changing (a lost claim):
        the next :meth:`sync` compares it again."""
        if self._unsynced is not None:
            self._unsynced.add(slot.name)

    def _unbuilt_clones(self, st: Any) -> dict[str, dict[str, str]]:
        return {n: dict(info) for n, info in st.clones.items() if n not in self.slots}

    def close_files(self) -> None:
        """The ``run()`` call ends: let go of ``schedule.csv`` (the writer has drained), and
        of the folder (another process may train it from now on)."""
        self._rows.close()
        with self.store.transaction(durable=False):
            leave(self.layout, self.worker)

    def read_wall_seconds(self) -> float:
        """Training wall time of the experiment's earlier sessions."""
        with self.store.transaction(durable=False) as st:
            return st.wall_seconds

    def reload_schedule(self) -> None:
        """Every worker's chunks, as ``schedule.csv`` has them."""
        self.schedule = read_schedule_csv(self.schedule_path)

    # ------------------------------------------------------------------ claims

    def new_call(self) -> None:
        """A ``run()`` call begins (every worker of a launch makes the same calls)."""
        self._train_calls += 1

    def claim(self) -> Claim:
        """Claim the next (run, chunk), recording in the same transaction the chunks whose
        checkpoints are on disk."""
        claimed = write = None
        # Not fsync'd: a claim is soft state (the writer committed what must be durable).
        with self._transaction(durable=False) as st:
            finished = self._record_finishes(st)
            clones = self._unbuilt_clones(st)
            # Under a launch nothing trains before the first worker has applied the ops its
            # script queued before this train() call (e.g. a stop; every worker makes the same
            # calls). A worker still in an earlier call than the first one's has nothing left
            # in it (held, it would wait for the later call's claims forever): it is done.
            token = f"{self.worker.launch}#{self._train_calls}"
            held = self.worker.launched and st.ready != token
            if held and self.worker.rank == 0:
                st.ready, held = token, False
            behind = held and ready_call(st.ready, self.worker.launch) > self._train_calls
            writing = {e.slot.name: e.committed for e in self._pending
                       if e.committed is not None}
            if not clones and not held and writing:
                # A run whose checkpoint is still being written stays claimed by this worker;
                # if it is the one to train next, wait for its write instead of moving on.
                chosen = self._choose(st, self.worker.id, finishing=writing)
                write = writing.get(chosen) if chosen is not None else None
            if not clones and not held and write is None:
                claimed = claim_next(st, self.worker.id, now=time.time(),
                                     lease_seconds=self.lease_seconds, pick=self._choose)
            # Runs this worker holds volatile that an idle worker could take: written first.
            handed = tuple(self.slots[n] for n in handoff(st, self.worker.id) if n in self.slots)
            # Nobody leaves while a search may still add runs, or others' runs be handed over.
            waiting = st.live_claims() or st.searching or self.worker.id in st.idle
            self.sync(st)
        recorded = tuple(finished)
        if clones:  # made by another worker: build them here too
            return Retry(recorded=recorded, handoff=handed, clones=clones)
        if write is not None:
            return Retry(recorded=recorded, handoff=handed, write=write)
        if claimed is not None:
            self._claimed = claimed
            return Turn(self.slots[claimed[0]], claimed[1], recorded=recorded, handoff=handed)
        if (waiting or held) and not behind:
            return Wait(recorded=recorded, handoff=handed)
        return Done(recorded=recorded, handoff=handed)

    def turn_over(self) -> None:
        """The claimed chunk's turn is over: recorded, released or failed from here on."""
        self._claimed = None

    def release_claim(self) -> None:
        """Give back a claim whose chunk was not finished (the loop stopped in its turn)."""
        if self._claimed is not None:
            name, self._claimed = self._claimed[0], None
            with self._transaction() as st:
                release(st, name, self.worker.id)

    def release(self, slot: RunSlot, *, sync: bool = False) -> None:
        """Give back ``slot``'s claim: its turn did not move it (or met a disk fault)."""
        with self._transaction() as st:
            release(st, slot.name, self.worker.id)
            if sync:
                self.sync(st)

    def fail(self, slot: RunSlot) -> None:
        """Record in the shared state that ``slot`` failed (its turn ends: see the caller)."""
        with self._transaction() as st:
            fail_claimed(st, slot.name, self.worker.id, slot.failure)
            self.sync(st)

    # ------------------------------------------------------------------ transactions

    @contextlib.contextmanager
    def _transaction(self, durable: bool = True) -> Iterator[Any]:
        """A transaction of this worker's loop: no record of the writer is in flight, and
        the ones it made are taken in first (see ``_commits``)."""
        with self._commits, self.store.transaction(durable=durable) as st:
            self._settle()
            yield st
