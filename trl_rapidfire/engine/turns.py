"""The mechanics of a run's turn, in this process: switching it in and out (its tensors, its
adapter, its RNG streams and accelerate state), parking it, continuing it from its checkpoint,
its boundary checkpoints and its final weights.

:class:`Turns` is also what every run's :class:`~.callback.ChunkCallback` talks to (it is the
callback's :class:`~.callback.TurnHost`)."""

from __future__ import annotations

import concurrent.futures
import copy
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import torch

from ..control.policies import Policy
from ..runtime.accelerate_state import restore_accelerate_state, snapshot_accelerate_state
from ..runtime.cache import StateCache
from ..runtime.model_pool import ModelPool
from ..runtime.switch import Aborted, RngState
from ..storage.checkpoints import (
    DEFAULT_CADENCE,
    CheckpointCadence,
    checkpoint_at,
    prune_checkpoints,
    remove_run_checkpoints,
    write_atomically,
    write_atomically_together,
)
from ..storage.faults import ExperimentFault, disk_fault, fault_message
from ..storage.names import inside
from .building import plan_for
from .callback import ChunkCallback
from .divergence import check_finite
from .faults import disk_faults
from .records import EngineStats, RunSlot, WeightsAt, Written
from .run_trainer import EvalCadence, RunTrainer

__all__ = ["Turns"]

# How long a checkpoint write waits for the next chunk to start before it goes ahead anyway
# (a safety net: every place the engine waits for a write opens the gate first).
_GATE_SECONDS = 0.5


class Turns:
    """Switches runs in and out of this process's device and writes what their turns leave.

    Args:
        output_dir: the experiment folder (every path written is checked to be inside it).
        cache: where parked run state lives.
        pool: the shared base models (moved on and off a CUDA device as runs take turns).
        slots: the engine's runs (shared, not copied).
        rank: this worker's rank (the first member of a gang prunes its checkpoints).
        stats: where the boundary checkpoints' counts and times are added up.
        replanned: told when a run's plan changes.
        rebuild: a fresh trainer for a run that continues from its checkpoint (``None``:
            this experiment cannot rebuild one).
        policy: the experiment's automatic control, if any.
    """

    def __init__(
        self, *, output_dir: Path, cache: StateCache, pool: ModelPool | None,
        slots: dict[str, RunSlot], rank: int, replanned: Callable[[], None],
        rebuild: Callable[[RunSlot], RunTrainer] | None = None,
        stats: EngineStats | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.cache = cache
        self.pool = pool
        self.slots = slots
        self.rank = rank
        # Write each run's checkpoint at chunk boundaries (what crash recovery and moving
        # runs between workers rest on), at most as often as the cadence says.
        self.durable = True
        self.cadence: CheckpointCadence = DEFAULT_CADENCE
        self.rebuild = rebuild
        # Stopped runs' checkpoints on the writer thread, not yet recorded as durable (see
        # durability.write_stopped).
        self.stopped_writes: list[Written] = []
        # Where it reads a run's metric (``Policy.evaluates_at``) is where a run with
        # ``eval_strategy="policy"`` is evaluated.
        self._policy = policy
        # The run whose tensors were switched in last.
        self.resident: RunSlot | None = None
        # Runs between turns whose tensors stayed where they were ("idle in place"), least
        # recently trained first: host tensors the state cache would only have taken over
        # as they are, counted against its budget (see _set_aside).
        self._idle: OrderedDict[str, RunSlot] = OrderedDict()
        self._idle_bytes: dict[str, int] = {}  # each idle run's bytes when it was set aside
        self._held = 0  # their sum
        self.stats = stats if stats is not None else EngineStats()
        self._replanned = replanned
        # One thread writes boundary checkpoints while the next run trains (made at the first
        # write of each run() call, ended by drain()).
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # Closed from a boundary until the next chunk starts: the writer (Python, holding the
        # GIL for milliseconds at a time) would otherwise take it from the switch itself.
        self._gate = threading.Event()
        self._gate.set()

    def open_writes(self) -> None:
        """Let the checkpoint writer go: the next chunk is starting (its steps release the
        GIL), or the engine is about to wait for a write."""
        self._gate.set()

    # ------------------------------------------------------------------ the callback's host

    plan_for = staticmethod(plan_for)

    def replanned(self) -> None:
        self._replanned()

    def evaluated(self, slot: RunSlot, seconds: float) -> None:
        self.stats.evaluations += 1
        self.stats.evaluation_seconds += seconds

    def evaluates_after(self, slot: RunSlot, chunks: int) -> bool:
        cadence = slot.evaluation
        if cadence is EvalCadence.CHUNK:
            return True
        if cadence is EvalCadence.NONE:
            return False
        total = len(slot.plan)
        # The run's end is always judged (the best run is picked by its last value).
        return chunks >= total or (self._policy is not None
                                   and self._policy.evaluates_at(slot.name, chunks, total))

    def attach(self, slot: RunSlot, trainer: RunTrainer) -> None:
        # The trainer's starting point: RNG streams and accelerate state as they are right
        # after it was built, what a script that built it alone would then train from.
        slot.trainer = trainer
        trainer.add_callback(ChunkCallback(self, slot))
        slot.turn.stateful = list(trainer.rf_stateful())
        slot.turn.stateful_states = [copy.deepcopy(obj.state_dict()) for obj in slot.turn.stateful]
        slot.turn.rng = RngState.capture()
        slot.turn.accelerate = snapshot_accelerate_state()

    def end_turn(self, slot: RunSlot) -> None:
        """Called inside the run's coroutine at a chunk boundary: suspend until resumed."""
        slot.turn.compute_seconds += time.perf_counter() - slot.turn.resumed_at
        slot.turn.at_boundary = True
        assert slot.turn.coroutine is not None  # called from inside it
        slot.turn.coroutine.suspend()
        slot.turn.at_boundary = False
        slot.turn.resumed_at = time.perf_counter()

    def save_boundary(self, slot: RunSlot, *, force: bool = False) -> None:
        """At a chunk boundary (inside the run's turn, or with the run switched in while its
        train() is suspended there: ``force``): write its checkpoint (atomically) if the
        cadence says it is due; else the boundary stays volatile. A written chunk counts as
        durable only once its checkpoint is on disk."""
        if not self.durable or slot.checkpoints is None:
            return
        step = int(slot.live_trainer().state.global_step)
        if not (force or slot.gang or self._due(slot)):
            # The random streams of an epoch-end boundary stay with the run: a checkpoint
            # taken at this boundary later must record them.
            slot.durability.volatile_chunks += 1
            self.stats.volatile_boundaries += 1
            return
        rng = None
        if slot.turn.epoch_end_rng is not None and slot.turn.epoch_end_rng[0] == step:
            rng = slot.turn.epoch_end_rng[1]
        slot.turn.epoch_end_rng = None
        target = slot.checkpoints / f"checkpoint-{step}"
        if slot.gang:
            # Written now, by every member together (collectives); only the first prunes.
            with disk_faults("the checkpoint", target):
                slot.live_trainer().rf_save_gang_boundary(target, rng)
            if self.rank == 0:
                prune_checkpoints(slot.checkpoints, keep=(
                    target, slot.checkpoints / f"checkpoint-{slot.state.global_step}"))
            slot.durability.write = None
            return
        started = time.perf_counter()
        with disk_faults("the checkpoint", target):
            finish = slot.live_trainer().rf_save_boundary(target, rng)
        spent = time.perf_counter() - started
        self.stats.checkpoints += 1
        self.stats.checkpoint_in_turn += spent
        # Durability is the engine's cost, not the run's: out of the turn's compute time.
        slot.turn.resumed_at += spent
        durability = slot.durability
        durability.volatile_chunks, durability.durable_compute = 0, self._compute_now(slot)
        # The checkpoint of the last durable boundary the shared state has recorded stays
        # until this one is recorded too (a crash in between resumes from it); older ones go.
        keep = (target, slot.checkpoints / f"checkpoint-{slot.state.durable_step}")
        folder = slot.checkpoints

        def write() -> None:
            self._gate.wait(_GATE_SECONDS)
            started = time.perf_counter()
            try:
                with disk_faults("the checkpoint", target):
                    finish()
                    prune_checkpoints(folder, keep=keep)
            finally:
                self.stats.checkpoint_writing += time.perf_counter() - started

        # Written while the next run trains; the chunk is recorded as done only after.
        self._gate.clear()
        slot.durability.write = self._writer.submit(write)

    def _due(self, slot: RunSlot) -> bool:
        return self.cadence.due(slot.durability.volatile_chunks + 1,
                                self._compute_now(slot) - slot.durability.durable_compute)

    @staticmethod
    def _compute_now(slot: RunSlot) -> float:
        """The run's compute seconds so far, its current turn included (when inside it)."""
        if slot.turn.at_boundary:
            return slot.turn.compute_seconds
        return slot.turn.compute_seconds + time.perf_counter() - slot.turn.resumed_at

    def make_durable(self, slot: RunSlot) -> concurrent.futures.Future | None:
        """Between turns: write the checkpoint of the boundary ``slot``'s train() is
        suspended at, if that boundary is volatile (it is stopped, or leaves this
        worker). Returns the write (``None``: nothing to write)."""
        if (slot.durability.volatile_chunks == 0 or not slot.turn.at_boundary
                or slot.turn.coroutine is None):
            return None
        self.switch_in(slot)
        try:
            self.save_boundary(slot, force=True)
        finally:  # a link refused on the way: the run fails alone, switched out as it was
            self.switch_out(slot)
        write, slot.durability.write = slot.durability.write, None
        return write

    def load_warm_optimizer_state(self, slot: RunSlot) -> None:
        """Inside the clone's ``train()``, once its optimizer exists: give it the parent's
        moments (shapes were checked when the clone was made)."""
        slot.residency.load_optimizer_state(slot.live_trainer().optimizer,
                                            slot.warm.optimizer_state)
        slot.warm.optimizer_state = None

    # ------------------------------------------------------------------ inside the coroutine

    def run_main(self, slot: RunSlot) -> None:
        """The body of the run's coroutine: its whole ``train()``, then its final weights."""
        slot.turn.resumed_at = time.perf_counter()
        try:
            kwargs = {}
            if slot.turn.resume_from is not None:
                kwargs["resume_from_checkpoint"] = str(slot.turn.resume_from)
            slot.outcome.train_output = slot.live_trainer().train(**kwargs)
            check_finite(slot, int(slot.live_trainer().state.global_step),
                         runs=len(self.slots))
            self._write_final(slot)
        except Aborted:
            pass
        except Exception as exc:  # a run's failure must not stop the others
            detail = disk_fault(exc)
            if detail is not None:  # not the run's doing: the experiment stops instead
                slot.outcome.fault = (
                    str(exc) if isinstance(exc, ExperimentFault)
                    else fault_message("the run's files", slot.run_dir, detail))
                return
            slot.record_error(exc)
        finally:
            # KeyboardInterrupt and SystemExit pass through to the scheduler, which stops.
            slot.outcome.finished = True
            slot.turn.compute_seconds += time.perf_counter() - slot.turn.resumed_at

    def _write_final(self, slot: RunSlot) -> None:
        trainer = slot.live_trainer()
        inside(self.output_dir, slot.final_dir)

        def write(folder: Path) -> None:
            trainer.save_model(str(folder))
            # What a worker that did not train the run needs to report it.
            trainer.state.save_to_json(str(folder / "trainer_state.json"))
            out = slot.outcome.train_output
            (folder / "train_output.json").write_text(json.dumps({
                "global_step": out.global_step, "training_loss": out.training_loss,
                "metrics": out.metrics,
            }, default=float), encoding="utf-8")

        with disk_faults("the final weights", slot.final_dir):
            if slot.gang:
                write_atomically_together(slot.final_dir, write)
            else:
                write_atomically(slot.final_dir, write)

    # ------------------------------------------------------------------ switching

    def switch_in(self, slot: RunSlot) -> None:
        prev = self.resident
        if prev is not None and prev is not slot and prev.residency.resident:
            self._set_aside(prev)
        self._unidle(slot.name)
        if slot.gang:
            # Its own model, sharded by its trainer, never leaves: nothing to bring back (its
            # train() loads a checkpoint it continues from).
            if slot.turn.weights is WeightsAt.CHECKPOINT:
                slot.turn.weights = WeightsAt.LIVE
            self.resident = slot
            self._restore_run_state(slot)
            return
        if self.pool is not None:
            self.pool.make_room(slot.model_group(), slot.live_trainer().args.device)
        if slot.turn.weights is not WeightsAt.LIVE:
            # Its values come from disk (its checkpoint, or its final weights): only room
            # for them is needed.
            slot.residency.materialize(self.cache)
            if slot.turn.weights is WeightsAt.CHECKPOINT:
                slot.turn.weights = WeightsAt.LIVE  # loaded by the train() it continues in
        elif not slot.residency.resident:
            if slot.residency.key in self.cache:
                slot.residency.unpark(self.cache, slot.live_trainer().optimizer)
            elif (initial := slot.model_group().initial_weights) is not None:
                slot.residency.load_initial(initial)
            else:
                raise RuntimeError(f"{slot.name}: no state to restore.")
        self.resident = slot
        if slot.adapter is not None and slot.model_group().model.active_adapter != slot.adapter:
            slot.model_group().activate(slot.adapter)
        self._restore_run_state(slot)

    def _set_aside(self, slot: RunSlot) -> None:
        """The end of ``slot``'s turn for its tensors: parked, or left idle in place.

        Parking frees the device for the next run; on the host there is nothing to free (the
        cache would hold these very tensors) and only a walk over every tensor to pay, twice a
        turn (~5 ms at a 135M model's shape). So a run whose tensors are on the host and its
        own (an adapter: full fine-tuning runs of one model share their parameters) stays in
        place while it is in the rotation and the cache's budget holds it; beyond the budget
        the least recently trained idle runs are parked (and the cache spills them to disk).
        Which tensors a forward pass reads is the active adapter's business, not this."""
        if (slot.adapter is None or slot.gang or not slot.state.status.schedulable
                or not slot.residency.on_host()):
            slot.residency.park(self.cache, slot.live_trainer().optimizer)
            return
        # The bytes idle runs hold are kept as a running sum: nothing here walks the other
        # runs (a turn's cost must not grow with their number).
        size = slot.residency.live_bytes(slot.live_trainer().optimizer)
        self._idle[slot.name] = slot
        self._idle_bytes[slot.name] = size
        self._held += size
        budget = self.cache.budget_bytes - self.cache.bytes_in_memory
        while self._idle and self._held > budget:
            name, oldest = self._idle.popitem(last=False)
            self._held -= self._idle_bytes.pop(name)
            oldest.residency.park(self.cache, oldest.live_trainer().optimizer)
            budget = self.cache.budget_bytes - self.cache.bytes_in_memory

    def _unidle(self, name: str) -> None:
        if self._idle.pop(name, None) is not None:
            self._held -= self._idle_bytes.pop(name)

    def _restore_run_state(self, slot: RunSlot) -> None:
        # Both captured when the run was attached to its trainer (before any switch).
        assert slot.turn.accelerate is not None and slot.turn.rng is not None
        restore_accelerate_state(slot.turn.accelerate)
        for obj, state in zip(slot.turn.stateful, slot.turn.stateful_states):
            obj.load_state_dict(copy.deepcopy(state))
        slot.turn.rng.restore()

    def switch_out(self, slot: RunSlot) -> None:
        slot.turn.rng = RngState.capture()
        slot.turn.accelerate = snapshot_accelerate_state()
        slot.turn.stateful_states = [copy.deepcopy(obj.state_dict()) for obj in slot.turn.stateful]

    def load_final(self, slot: RunSlot) -> None:
        """After ``slot`` (finished elsewhere) was switched in: its final weights and trainer
        state from disk become its live ones."""
        slot.live_trainer().rf_load_final(slot.final_dir, slot.outcome.disk_state)
        slot.turn.weights = WeightsAt.LIVE
        slot.turn.local_chunks = slot.state.chunks_done

    # ------------------------------------------------------------------ parking and dropping

    def park(self, slot: RunSlot) -> None:
        """Park ``slot``'s tensors now (a stopped run) instead of at the next switch."""
        self._unidle(slot.name)
        slot.residency.park(self.cache, slot.live_trainer().optimizer)
        if self.resident is slot:
            self.resident = None

    def drop(self, slot: RunSlot) -> None:
        """Forget a failed run's tensors."""
        self._unidle(slot.name)
        slot.residency.drop(self.cache)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # after an out-of-memory error, give the rest back
        if self.resident is slot:
            self.resident = None

    def forget(self, slot: RunSlot) -> None:
        """Unwind a deleted (or policy-failed) run's ``train()`` and forget its tensors."""
        if slot.turn.coroutine is not None and not slot.turn.coroutine.finished:
            slot.turn.coroutine.abort()
        self._unidle(slot.name)
        slot.residency.drop(self.cache)
        if self.resident is slot:
            self.resident = None

    def abort_suspended(self) -> None:
        # Runs left suspended (the loop was interrupted) unwind their train() calls now.
        for slot in self.slots.values():
            if slot.turn.coroutine is not None and not slot.turn.coroutine.finished:
                slot.turn.coroutine.abort()

    def remove_checkpoints(self, folder: Path) -> None:
        """A completed run's boundary checkpoints (``folder``) go, its final weights being
        written, by the writer thread: ~2 ms of the switch on the tiny model, more with a
        real one. Removed by folder descriptors from the experiment's root: a folder swapped
        for a link is left (and named when the experiment next starts), never followed, and
        never a reason to stop the other runs."""
        self._writer.submit(remove_run_checkpoints, folder)

    @property
    def _writer(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="rapidfire-checkpoint")
        return self._pool

    def drain(self) -> None:
        """Wait until everything handed to the writer thread is done, and end the thread."""
        pool, self._pool = self._pool, None
        self.open_writes()
        if pool is not None:
            pool.shutdown(wait=True)

    # ------------------------------------------------------------------ continuing from disk

    def continue_from_disk(self, slot: RunSlot) -> None:
        """The shared state is ahead of this worker's live train() of ``slot``: continue from
        the run's checkpoint at its last boundary, with a fresh trainer if this one ran."""
        done = slot.state.chunks_done
        if done == 0:
            # Only a claim lost in the first chunk (lease expired) leads here: the starting
            # weights this worker had are gone, and no checkpoint exists yet.
            raise RuntimeError(f"{slot.name} must restart from its first chunk, and its "
                               "starting weights are no longer in this worker")
        step = slot.plan.chunks[done - 1].end_step
        ckpt = checkpoint_at(slot.checkpoints, step) if slot.checkpoints else None
        if ckpt is None:
            raise RuntimeError(
                f"{slot.name} has {done} chunk(s) done but no checkpoint at step {step} in "
                f"{slot.checkpoints}; it cannot continue exactly."
            )
        if slot.turn.coroutine is not None:
            if not slot.turn.coroutine.finished:
                slot.turn.coroutine.abort()
            slot.turn.coroutine = None
            if self.rebuild is None:
                raise RuntimeError(f"{slot.name}: this experiment cannot rebuild a trainer")
            self.attach(slot, self.rebuild(slot))
        slot.turn.resume_from = ckpt
        slot.durability.volatile_chunks = 0
        slot.durability.durable_compute = slot.turn.compute_seconds
        slot.turn.weights = WeightsAt.CHECKPOINT
        slot.warm.optimizer_state = None  # a warm clone's start: its checkpoint supersedes it
        slot.warm.checkpoint = None
        slot.turn.yielded_at = {step}
        slot.outcome.finished = False
        slot.turn.local_chunks = done

