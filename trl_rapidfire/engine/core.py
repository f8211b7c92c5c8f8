"""The :class:`Engine`: the face the trainer layer sees, and the loop of a ``run()`` call.

The engine is composed of collaborators, each in a module of its own: :class:`~.turns.Turns`
(switching runs in and out, their checkpoints), :class:`~.coordination.Coordinator` (claims
and records in the shared state), :class:`~.ops.OpsDesk` (control ops and clones) and
:class:`~.reporting.Reporter` (the tracker). The loop asks them in turn; nothing below it
calls back up. What each ``run()`` call does before and after its loop is
:class:`~.run_call.RunCallEdges`'s."""

from __future__ import annotations

import concurrent.futures
import gc
import time
import warnings
from pathlib import Path

from ..control.ops import OpRecord, OpSource
from ..control.policies import Policy
from ..reports.progress import ExperimentProgress
from ..reports.ranking import RankingMetric
from ..reports.results import RunResult
from ..runtime.cache import StateCache
from ..runtime.model_pool import ModelPool
from ..runtime.switch import RunCoroutine
from ..runtime.workers import current_worker
from ..shared_state.runs import RunStatus
from ..shared_state.scheduler import Order
from ..shared_state.state_file import FileStore
from ..shared_state.store import StateStore, is_proposal
from ..shared_state.worker_info import WorkerInfo
from ..storage.checkpoints import DEFAULT_CADENCE, CheckpointCadence
from ..storage.faults import ExperimentFault, disk_fault, fault_message
from ..storage.layout import Layout
from ..storage.schedule import ChunkRecord
from ..tracking.tracker import Tracker
from .building import RunRegistry
from .clones import Clones
from .coordination import Claim, Coordinator, Done, GangWait, Retry, Turn, Wait
from .durability import make_durable, write_stopped
from .faults import FaultNote
from .lifetime import LeaseKeeper, WallClock, orphaned
from .ops import OpsDesk
from .proposals import Proposals, Proposer
from .records import EngineStats, LoopHooks, RunSlot, WeightsAt
from .reporting import Reporter, chunks_trained
from .run_call import RunCallEdges
from .run_trainer import RunFactory
from .turns import Turns

__all__ = ["Engine"]


class Engine(RunCallEdges):
    """Runs the registered runs chunk by chunk until each is completed or failed.

    Args:
        output_dir: the experiment folder (``schedule.csv`` and ``runs/<name>/`` go here).
        cache: where parked run state lives.
        progress: show the progress bar and the runs table at chunk boundaries.
        store: the experiment's shared scheduler state (default: a file store in
            ``<output_dir>/.rapidfire`` for this process alone).
        worker: who this worker is (default: this process, see
        :mod:`trl_rapidfire.runtime.workers`).
        pool: the shared base models (moved on and off a CUDA device as runs take turns).
        durable: write each run's checkpoint at every chunk boundary (what crash recovery
            and moving runs between workers rest on).
        lease_seconds: how long a claim lives without renewal (the worker renews it while it
            trains; on this machine a dead worker is noticed at once, whatever the lease).
        runs: builds trainers for rebuilt runs and clones (the trainer layer's); ``None``:
            this engine neither rebuilds nor clones.
        policy: automatic control at chunk ends (see :mod:`trl_rapidfire.control.policies`).
        tracker: where runs, metrics and op answers go (MLflow), and ops come from.
        proposer: an adaptive search that proposes runs while the experiment trains (see
            :mod:`.proposals`); ``None``: every run is registered before ``run()``.
    """

    def __init__(
        self,
        output_dir: str | Path,
        cache: StateCache,
        *,
        progress: bool = True,
        store: StateStore | None = None,
        worker: WorkerInfo | None = None,
        pool: ModelPool | None = None,
        durable: bool = True,
        lease_seconds: float = 120.0,
        runs: RunFactory | None = None,
        policy: Policy | None = None,
        tracker: Tracker | None = None,
        proposer: Proposer | None = None,
        checkpoint_every: CheckpointCadence | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.layout = Layout(self.output_dir)
        self.cache = cache
        self.worker = worker or current_worker()
        self.store: StateStore = store or FileStore(self.layout.state_dir, fingerprint="")
        self.pool = pool
        self.slots: dict[str, RunSlot] = {}
        self.stats = EngineStats()
        self.hooks = LoopHooks()
        self.interrupted = False
        self.show_progress = progress  # bar and runs table; off where a notebook panel shows
        self._progress: ExperimentProgress | None = None
        self.ranking: RankingMetric | None = None  # the live table's order (the trainer's)
        self._registered = False
        # A disk fault stopped the experiment: this engine trains no more; a re-run continues.
        self._fault = FaultNote()
        self._clock = WallClock()
        self._reporter = Reporter(tracker)
        self._lease = LeaseKeeper(self.store, self.worker.id)
        self._turns = Turns(output_dir=self.output_dir, cache=cache, pool=pool,
                            slots=self.slots, rank=self.worker.rank, replanned=self.replanned,
                            rebuild=runs.rebuild if runs is not None else None,
                            stats=self.stats, policy=policy)
        self._turns.durable = durable
        self._turns.cadence = checkpoint_every or DEFAULT_CADENCE
        self._shared = Coordinator(
            store=self.store, worker=self.worker, slots=self.slots, forget=self._turns.forget,
            clock=self._clock, fault=self._fault, schedule_path=self.layout.schedule,
            lease_seconds=lease_seconds,
            order=proposer.order if proposer is not None else Order.EVEN,
        )
        # Runs are registered through it (built, planned, or failed before training).
        self.registry = RunRegistry(
            layout=self.layout, slots=self.slots, runs=runs, attach=self._turns.attach,
            ensure_run=self._reporter.ensure_run, replanned=self.replanned)
        clones = Clones(layout=self.layout, slots=self.slots, cache=cache, runs=runs,
                        register=self.registry.register, prepare=self.registry.build)
        self._ops = OpsDesk(
            layout=self.layout, store=self.store, worker=self.worker, slots=self.slots,
            clones=clones, policy=policy, turns=self._turns, shared=self._shared,
            reporter=self._reporter, clock=self._clock, replanned=self.replanned,
        )
        self._proposals = Proposals(
            proposer=proposer, layout=self.layout, store=self.store, slots=self.slots,
            shared=self._shared, runs=runs, register=self.registry.register,
            replanned=self.replanned,
            policy=self._ops,
        )

    def build_now(self, name: str) -> RunSlot:
        """``name``'s record, its trainer built now if it was planned (between turns only)."""
        self.registry.build(self.slots[name])
        return self.slots[name]

    def replanned(self) -> None:
        if self._progress is not None:
            self._progress.set_total(self.total_chunks)

    @property
    def total_chunks(self) -> int:
        """The chunks the experiment trains: a run's whole plan, but only what it trained
        for a run stopped, failed or deleted (so that a policy's stops end the count)."""
        return sum(len(s.plan) if s.state.status.schedulable
                   or s.state.status == RunStatus.COMPLETED else chunks_trained(s)
                   for s in self.slots.values())

    def results(self) -> list[RunResult]:
        # A copy of the slots: a clone may be added meanwhile by a training thread.
        return [s.result() for s in list(self.slots.values())]

    def failures(self) -> dict[str, str]:
        return {s.name: s.failure for s in self.slots.values()
                if s.state.status == RunStatus.FAILED}

    def activate(self, name: str) -> None:
        """Make ``name``'s weights the live ones in its model (after training, for the best
        run: ``trainer.model``, ``save_model()``, ``evaluate()``)."""
        slot = self.build_now(name)
        final = slot.turn.weights is WeightsAt.FINAL  # trained to the end elsewhere: on disk
        self._switch_in(slot)
        if final:
            self._turns.load_final(slot)

    # ---------------------------------- the trainer layer's face (each kept by a collaborator)

    @property
    def policy(self) -> Policy | None:
        """The automatic control consulted at chunk ends (kept by the ops desk)."""
        return self._ops.policy

    @property
    def tracker(self) -> Tracker | None:
        """Where runs, metrics and op answers go (kept by the reporter)."""
        return self._reporter.tracker

    @property
    def durable(self) -> bool:
        """Whether boundaries are written as checkpoints (kept by the turns; settable)."""
        return self._turns.durable

    @durable.setter
    def durable(self, value: bool) -> None:
        self._turns.durable = value

    @property
    def op_log(self) -> list[OpRecord]:
        """Every op handled so far, applied or not (kept by the ops desk)."""
        return self._ops.op_log

    @property
    def schedule(self) -> list[ChunkRecord]:
        """Who trained which chunk when (kept by the coordinator)."""
        return self._shared.schedule

    def queue_op(self, run: str, op: str, source: OpSource | str = "python",
                 reason: str | None = None) -> None:
        """Apply ``op`` to ``run`` at the next chunk boundary (or the next ``train()``)."""
        self._ops.queue_op(run, op, source=source, reason=reason)

    def apply_ops(self) -> list[OpRecord]:
        """Apply every pending op now (see :meth:`.ops.OpsDesk.apply_ops`)."""
        return self._ops.apply_ops()

    def _switch_in(self, slot: RunSlot) -> None:
        if self.hooks.before_switch_in is not None:
            self.hooks.before_switch_in(slot)
        self._turns.switch_in(slot)

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Train every registered run to the end (or to its failure).

        With several workers (``accelerate launch``), returns when no run is left for any of
        them. The first Ctrl-C stops at the next chunk boundary (``interrupted`` is set, the
        finished chunks are on disk, a re-run continues); a second one stops at once.
        """
        if self._fault.message is not None:
            raise ExperimentFault(self._fault.message)
        started, previous_handler = self._start_run_call()
        ok = False
        outcome = "failed"
        try:
            self._loop()
            ok = self._fault.message is None
            outcome = "killed" if self.interrupted else "finished" if ok else "failed"
        except KeyboardInterrupt:  # a second Ctrl-C: at once
            outcome = "killed"
            raise
        except Exception as exc:
            detail = disk_fault(exc, ours=True) if isinstance(exc, OSError) else None
            if isinstance(exc, ExperimentFault) or detail is not None:
                self._fault.note(str(exc) if detail is None else
                                 fault_message("the experiment's files", None, detail))
            else:
                raise
        finally:
            self._end_run_call(started, ok, previous_handler, outcome)
        if self._fault.message is not None:
            raise ExperimentFault(self._fault.message)

    def _loop(self) -> None:
        """The scheduler loop of one ``run()`` call."""
        if not self._registered:
            self._register()
        self._announce_training()
        if self.worker.rank == 0:
            self._clock.before = self._shared.read_wall_seconds()
        if self._progress is not None:  # made by this loop's run() call (says if it continues)
            self.replanned()  # the runs' states as registered: a stopped run's count is less
            self._progress.begin(self._chunks_done())
        while not self.interrupted and self._fault.message is None:
            if self.worker.launched and orphaned(self.worker.rank):
                # Its launcher died (killed alone): stop at this boundary, so that a re-run
                # never shares the experiment with this worker.
                self.interrupted = True
                break
            self._ops.consult_policy()
            if self.hooks.at_boundary is not None:
                self.hooks.at_boundary()
            if self._ops.pending():
                # Ops act on runs as of their last trained chunk: record those first.
                self._flush_finishes()
                self.apply_ops()
            self._proposals.step()
            if self._shared.stopped_volatile or self._turns.stopped_writes:
                for slot in write_stopped(self._turns, self._shared):
                    self._after_turn(slot)  # failed: a link on its write's way
            match self._claim():
                case Done():
                    # The search may still add runs; ops sent for this call may add chunks.
                    if not (self._proposals.step() or self._ops.waiting_at_end(len(self.schedule))):
                        break
                case Retry():
                    continue
                case Wait():
                    # Waiting for our own checkpoint writes (their runs stay claimed until
                    # recorded), else for other workers.
                    self._turns.open_writes()
                    if not self._shared.wait_for_a_write():
                        time.sleep(self._shared.idle_wait)
                case Turn() as turn:
                    self._turn(turn)

    def _register(self) -> None:
        """First ``run()``: put this process's runs in the shared state, or take the state
        that an earlier process (a killed experiment) or another worker left."""
        records, clones = self._shared.register()
        self._build_added(clones)
        for name, record in records.items():
            if name in self.slots:
                slot = self.slots[name]
                self._shared.adopt(slot, record)
                if record.chunks_done and self.worker.rank == 0:
                    self._reporter.recovered(slot)
        self._registered = True

    def _claim(self) -> Claim:
        """Claim the next chunk; the turns of the chunks recorded meanwhile end first, and a
        :class:`Retry`'s clones are built (or its write waited for) before it is returned."""
        claim = self._shared.claim()
        for slot in claim.recorded:
            self._after_turn(slot)
        if claim.handoff:
            for slot in make_durable(self._turns, self._shared, claim.handoff):
                self._after_turn(slot)  # failed: a link on its write's way
        if isinstance(claim, Retry):
            self._build_added(claim.clones)
            if claim.write is not None:
                self._turns.open_writes()
                concurrent.futures.wait([claim.write])
        return claim

    def _build_added(self, recipes: dict[str, dict[str, str]]) -> None:
        """Build the runs another worker (or an earlier session) added mid-flight: clones,
        and an adaptive search's proposals."""
        for name, recipe in recipes.items():
            if is_proposal(recipe):
                self._proposals.build_from_recipe(name, recipe)
            else:
                self._ops.build_clone_from_store(name, recipe)

    def _turn(self, claim: Turn) -> None:
        """Train the claimed chunk: switch the run in, resume it until its next boundary (or
        its end), switch it out, and record the chunk (or release or fail it)."""
        slot, chunk_number, shared = claim.slot, claim.chunk, self._shared
        if slot.planned or slot.continues_from_disk():
            try:
                self.registry.build(slot)  # a planned run's trainer, at its first turn
                if slot.continues_from_disk():
                    self._turns.continue_from_disk(slot)
            except Exception as exc:  # noqa: BLE001 - this run fails, the others go on
                slot.record_error(exc)
                shared.turn_over()
                shared.fail(slot)
                self._after_turn(slot)
                return
        if slot.gang:
            gang = shared.wait_for_gang(slot)
            if gang is not GangWait.READY:
                if gang is GangWait.TIMED_OUT:
                    self._after_turn(slot)  # it failed
                shared.turn_over()  # a member is gone: the chunk will be trained again
                return
        chunk = slot.plan.chunks[chunk_number] if chunk_number < len(slot.plan) else None
        start_step = chunk.start_step if chunk is not None else slot.state.global_step
        self._switch_in(slot)
        if slot.turn.coroutine is None:
            # Its train() starts with a full gc.collect() (accelerate's free_memory): what the
            # runs started before it made (optimizers, dataloaders, suspended frames) lives on,
            # and frozen it is not scanned again, so a run's start does not grow with the
            # number of runs started before it.
            gc.freeze()
            slot.turn.coroutine = RunCoroutine(lambda: self._turns.run_main(slot), name=slot.name)
        if self._progress is not None:
            self._progress.start(slot.name)
        t0 = time.time()
        self._reporter.set_active(True)  # MLflow work runs while the chunk computes...
        self._lease.hold(slot.name, self._shared.lease_seconds)
        self._turns.open_writes()  # the previous run's checkpoint is written while this trains
        try:
            slot.turn.coroutine.resume()
        finally:
            self._lease.drop()
            self._reporter.set_active(False)  # ...and waits while the engine switches
        t1 = time.time()
        self._turns.switch_out(slot)
        end_step = int(slot.live_trainer().state.global_step)
        shared.turn_over()

        if slot.outcome.fault is not None:
            # Its train() is gone; the chunk is trained again, by a re-run, from the last
            # boundary on disk (kept until a newer one is recorded).
            self._fault.note(slot.outcome.fault)
            slot.outcome.fault, slot.turn.coroutine = None, None
            shared.release(slot)
            return
        moved = end_step > start_step or slot.outcome.finished
        record = ChunkRecord(
            run=slot.name, epoch=chunk.epoch if chunk else 0,
            chunk=chunk.index if chunk else 0, number=chunk_number,
            worker=self.worker.rank, start_time=t0, end_time=t1,
            start_step=start_step, end_step=end_step,
        )
        if slot.outcome.error is not None:
            shared.fail(slot)
        elif slot.gang and moved:
            shared.finish_gang_chunk(slot, record)
            self._after_turn(slot)  # (a gang chunk's turn ends twice, as it always has)
        elif moved:
            shared.defer_finish(slot, record)  # recorded once its checkpoint is on disk
            return
        else:
            shared.release(slot, sync=True)
        self._after_turn(slot)

    def _after_turn(self, slot: RunSlot) -> None:
        if slot.outcome.error is not None and slot.state.status == RunStatus.FAILED:
            self._turns.drop(slot)
            warnings.warn(f"{slot.name} failed: {slot.outcome.error}", RuntimeWarning, stacklevel=3)
        if slot.state.status == RunStatus.COMPLETED and slot.checkpoints is not None:
            self._turns.remove_checkpoints(slot.checkpoints)
        self._reporter.report(slot)
        if self._progress is not None and self._progress.showing and slot.outcome.error is None:
            self._progress.chunk_done(self.results, self._chunks_done,  # built when drawn
                                      lambda: self.total_chunks)

    def _flush_finishes(self) -> None:
        self._turns.open_writes()
        for slot in self._shared.flush_finishes():
            self._after_turn(slot)

    def _chunks_done(self) -> int:  # as the runs table's steps show them (see chunks_trained)
        return sum(chunks_trained(s) for s in self.slots.values())
