"""The edges of an engine's ``run()`` call: what every call does first (its progress view,
the collector frozen, the tracker's thread, the folder marked alive, the Ctrl-C handler) and
last, however its loop ended (what finished written, the claim released, the writer drained,
the views told the outcome). :class:`~.core.Engine` is made with it; the loop between the two
edges is the engine's own."""

from __future__ import annotations

import contextlib
import gc
import signal
import time
from typing import TYPE_CHECKING, Any

from ..control.folder_control import mark_alive, mark_ended
from ..reports.progress import ExperimentProgress
from ..reports.ranking import RankingMetric, write_ranking
from ..shared_state.runs import RunStatus
from ..shared_state.store import StateStore
from ..shared_state.worker_info import WorkerInfo
from ..storage.layout import Layout
from .coordination import Coordinator
from .durability import make_durable
from .faults import FaultNote
from .lifetime import LeaseKeeper, WallClock, install_ending_sigint, install_sigint
from .ops import OpsDesk
from .records import EngineStats, RunSlot
from .reporting import Reporter
from .turns import Turns

__all__ = ["RunCallEdges"]


class RunCallEdges:
    """The first and last steps of every ``run()`` call, for the engine that inherits them
    (its parts, declared here, are made by its constructor)."""

    layout: Layout
    worker: WorkerInfo
    store: StateStore
    slots: dict[str, RunSlot]
    stats: EngineStats
    interrupted: bool
    show_progress: bool
    ranking: RankingMetric | None
    _progress: ExperimentProgress | None
    _fault: FaultNote
    _clock: WallClock
    _reporter: Reporter
    _lease: LeaseKeeper
    _turns: Turns
    _shared: Coordinator
    _ops: OpsDesk

    if TYPE_CHECKING:
        @property
        def total_chunks(self) -> int: ...

        @property
        def schedule(self) -> list[Any]: ...

        def _flush_finishes(self) -> None: ...

        def _after_turn(self, slot: RunSlot) -> None: ...

    def _start_run_call(self) -> tuple[float, Any]:
        """What every ``run()`` call does first: returns when it started and the Ctrl-C
        handler it replaced."""
        # Under a launch the first worker shows the experiment's progress for all of them.
        self._progress = ExperimentProgress(self.total_chunks, ranking=self.ranking,
                                            enabled=self.show_progress and self.worker.rank == 0)
        # Every run's train() starts with accelerate's free_memory(), a full gc.collect() (~0.2 s
        # with the HF stack imported): what is built so far lives as long as the experiment, so
        # it is frozen out of the collector's view. Young generations only are collected first
        # (a full collection found ~100 cyclic objects in 0.34 s at 1000 runs).
        gc.collect(1)
        gc.freeze()
        # Only the first worker applies ops from tags: the others need not poll them.
        self._reporter.start(polling=self.worker.rank == 0)
        started = self._clock.started = time.perf_counter()
        self._shared.new_call()
        self._ops.new_call()
        self.interrupted = False
        return started, install_sigint(self)

    def _announce_training(self) -> None:
        """Once this worker is registered (so a second process refused there never takes the
        folder's ``alive.json`` from the one training it): say that this process trains."""
        if self.worker.rank != 0:
            return
        with contextlib.suppress(OSError):  # advisory: the CLI's check for untracked runs
            mark_alive(self.layout)
        if self.ranking is not None:  # for the views of an untracked experiment; written
            # by train(), not by the constructor (building writes nothing to the folder)
            write_ranking(self.layout.output_dir, self.ranking)

    def _end_run_call(self, started: float, ok: bool, previous_handler: Any,
                      outcome: str) -> None:
        """What every ``run()`` call does last, however its loop ended (``outcome``:
        ``finished``, ``failed`` or ``killed``)."""
        if previous_handler is not None:
            install_ending_sigint()
        try:
            self._end_writes(started, ok)
        except KeyboardInterrupt:
            outcome = "killed"  # a Ctrl-C twice while ending: the views must still say so
            raise
        finally:
            if previous_handler is not None:
                signal.signal(signal.SIGINT, previous_handler)
            self._reporter.finish(self.slots.values(), outcome, stacklevel=2)

    def _end_writes(self, started: float, ok: bool) -> None:
        # A disk fault in the clean-up is noted, never raised over what ended the loop.
        with self._fault.kept():
            self._flush_finishes()  # a finished chunk is never lost, whatever stopped
        if self._fault.message is None:
            with self._fault.kept():
                # The runs leave this worker: what the cadence left volatile is written.
                for slot in make_durable(self._turns, self._shared, [
                        s for s in self.slots.values() if s.durability.volatile_chunks
                        and s.state.status in (RunStatus.RUNNING, RunStatus.STOPPED)]):
                    self._after_turn(slot)  # failed: a link on its write's way
        with self._fault.kept():
            self._shared.release_claim()
        # A completed run's checkpoints are gone when train() returns, and no thread of this
        # call outlives it.
        self._turns.drain()
        self._shared.close_files()
        self._lease.close()
        with self._fault.kept():  # scheduler.json alone is the whole state between calls
            self.store.compact()
        if self.worker.rank == 0:
            mark_ended(self.layout)
        gc.unfreeze()
        self.stats.wall += time.perf_counter() - started
        self._clock.started = None
        self.stats.compute = sum(s.turn.compute_seconds for s in self.slots.values())
        self.stats.turns = len(self.schedule)
        if self._progress is not None:
            self._progress.close()
        self._progress = None
        if ok and self.worker.launched:
            self._shared.reload_schedule()
        if not ok:
            # Interrupted: unwind every suspended train(). On a normal end the only
            # suspended runs are stopped ones, kept resumable for a later train().
            self._turns.abort_suspended()
