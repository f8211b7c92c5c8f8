"""The mechanics of a run's turn, in this process: switching it in and out (its tensors, its
adapter, its RNG streams and accelerate state), parking it, continuing it from its checkpoint,
its boundary checkpoints and its final weights.

:class:`Turns` is also what every run's :class:`~.callback.ChunkCallback` talks to (it is the
callback's :class:`~.callback.TurnHost`)."""

from __future__ import annotations

import concurrent.futures
import copy
import json
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..accelerate_state import restore_accelerate_state, snapshot_accelerate_state
from ..cache import StateCache
from ..durable import checkpoint_at, prune_checkpoints, write_atomically, write_atomically_together
from ..faults import ExperimentFault, disk_fault, fault_message
from ..models import ModelPool
from ..switch import Aborted, RngState
from ..trust import inside
from .building import plan_for
from .callback import ChunkCallback
from .divergence import check_finite
from .records import EngineStats, RunSlot, WeightsAt
from .run_trainer import RunTrainer
from .support import disk_faults

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
    """

    def __init__(
        self, *, output_dir: Path, cache: StateCache, pool: ModelPool | None,
        slots: dict[str, RunSlot], rank: int, replanned: Callable[[], None],
        rebuild: Callable[[RunSlot], RunTrainer] | None = None,
        stats: EngineStats | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.cache = cache
        self.pool = pool
        self.slots = slots
        self.rank = rank
        # Write each run's checkpoint at every chunk boundary (what crash recovery and moving
        # runs between workers rest on).
        self.durable = True
        self.rebuild = rebuild
        # The run whose tensors were switched in last.
        self.resident: RunSlot | None = None
        # Runs between turns whose tensors stayed where they were ("idle in place"), least
        # recently trained first: host tensors the state cache would only have taken over
        # as they are, counted against its budget (see _set_aside).
        self._idle: OrderedDict[str, RunSlot] = OrderedDict()
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

    def attach(self, slot: RunSlot, trainer: RunTrainer) -> None:
        # The trainer's starting point: RNG streams and accelerate state as they are right
        # after it was built, what a script that built it alone would then train from.
        slot.trainer = trainer
        trainer.add_callback(ChunkCallback(self, slot))
        slot.stateful = list(trainer.rf_stateful())
        slot.stateful_states = [copy.deepcopy(obj.state_dict()) for obj in slot.stateful]
        slot.rng = RngState.capture()
        slot.accelerate = snapshot_accelerate_state()

    def end_turn(self, slot: RunSlot) -> None:
        """Called inside the run's coroutine at a chunk boundary: suspend until resumed."""
        slot.compute_seconds += time.perf_counter() - slot.resumed_at
        slot.coroutine.suspend()
        slot.resumed_at = time.perf_counter()

    def save_boundary(self, slot: RunSlot) -> None:
        """Inside the run's turn, at a chunk boundary: write its checkpoint (atomically).
        The chunk counts as done only after this."""
        if not self.durable or slot.checkpoints is None:
            return
        step = int(slot.trainer.state.global_step)
        rng = None
        if slot.epoch_end_rng is not None and slot.epoch_end_rng[0] == step:
            rng = slot.epoch_end_rng[1]
        slot.epoch_end_rng = None
        target = slot.checkpoints / f"checkpoint-{step}"
        if slot.gang:
            # Written now, by every member together (collectives); only the first prunes.
            with disk_faults("the checkpoint", target):
                slot.trainer.rf_save_gang_boundary(target, rng)
            if self.rank == 0:
                prune_checkpoints(slot.checkpoints, keep=(
                    target, slot.checkpoints / f"checkpoint-{slot.state.global_step}"))
            slot.write = None
            return
        started = time.perf_counter()
        with disk_faults("the checkpoint", target):
            finish = slot.trainer.rf_save_boundary(target, rng)
        self.stats.checkpoints += 1
        self.stats.checkpoint_in_turn += time.perf_counter() - started
        # The checkpoint of the last boundary the shared state has recorded stays until this
        # one is recorded too (a crash in between resumes from it); older ones go.
        keep = (target, slot.checkpoints / f"checkpoint-{slot.state.global_step}")
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
        slot.write = self._writer.submit(write)

    def load_warm_optimizer_state(self, slot: RunSlot) -> None:
        """Inside the clone's ``train()``, once its optimizer exists: give it the parent's
        moments (shapes were checked when the clone was made)."""
        slot.residency.load_optimizer_state(slot.trainer.optimizer, slot.warm_optimizer_state)
        slot.warm_optimizer_state = None

    # ------------------------------------------------------------------ inside the coroutine

    def run_main(self, slot: RunSlot) -> None:
        """The body of the run's coroutine: its whole ``train()``, then its final weights."""
        slot.resumed_at = time.perf_counter()
        try:
            kwargs = {}
            if slot.resume_from is not None:
                kwargs["resume_from_checkpoint"] = str(slot.resume_from)
            slot.train_output = slot.trainer.train(**kwargs)
            check_finite(slot, int(slot.trainer.state.global_step))
            self._write_final(slot)
        except Aborted:
            pass
        except Exception as exc:  # a run's failure must not stop the others
            detail = disk_fault(exc)
            if detail is not None:  # not the run's doing: the experiment stops instead
                slot.fault = str(exc) if isinstance(exc, ExperimentFault) else fault_message(
                    "the run's files", slot.run_dir, detail)
                return
            slot.record_error(exc)
        finally:
            # KeyboardInterrupt and SystemExit pass through to the scheduler, which stops.
            slot.finished = True
            slot.compute_seconds += time.perf_counter() - slot.resumed_at

    def _write_final(self, slot: RunSlot) -> None:
        trainer = slot.trainer
        inside(self.output_dir, slot.final_dir)

        def write(folder: Path) -> None:
            trainer.save_model(str(folder))
            # What a worker that did not train the run needs to report it.
            trainer.state.save_to_json(str(folder / "trainer_state.json"))
            out = slot.train_output
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
        self._idle.pop(slot.name, None)
        if slot.gang:
            # Its own model, sharded by its trainer, never leaves: nothing to bring back (its
            # train() loads a checkpoint it continues from).
            if slot.weights is WeightsAt.CHECKPOINT:
                slot.weights = WeightsAt.LIVE
            self.resident = slot
            self._restore_run_state(slot)
            return
        if self.pool is not None:
            self.pool.make_room(slot.group, slot.trainer.args.device)
        if slot.weights is not WeightsAt.LIVE:
            # Its values come from disk (its checkpoint, or its final weights): only room
            # for them is needed.
            slot.residency.materialize(self.cache)
            if slot.weights is WeightsAt.CHECKPOINT:
                slot.weights = WeightsAt.LIVE  # loaded by the train() it continues in
        elif not slot.residency.resident:
            if slot.residency.key in self.cache:
                slot.residency.unpark(self.cache, slot.trainer.optimizer)
            elif slot.group.initial_weights is not None:
                slot.residency.load_initial(slot.group.initial_weights)
            else:
                raise RuntimeError(f"{slot.name}: no state to restore.")
        self.resident = slot
        if slot.adapter is not None and slot.group.model.active_adapter != slot.adapter:
            slot.group.activate(slot.adapter)
        self._detach_idle(slot.group)
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
            slot.residency.park(self.cache, slot.trainer.optimizer)
            return
        self._idle[slot.name] = slot
        for other in [s for s in self._idle.values() if not s.state.status.schedulable]:
            self.park(other)  # out of the rotation meanwhile (another worker finished it)
        budget = self.cache.budget_bytes - self.cache.bytes_in_memory
        held = sum(s.residency.live_bytes(s.trainer.optimizer) for s in self._idle.values())
        while self._idle and held > budget:
            _, oldest = self._idle.popitem(last=False)
            held -= oldest.residency.live_bytes(oldest.trainer.optimizer)
            oldest.residency.park(self.cache, oldest.trainer.optimizer)
            budget = self.cache.budget_bytes - self.cache.bytes_in_memory

    def _restore_run_state(self, slot: RunSlot) -> None:
        restore_accelerate_state(slot.accelerate)
        for obj, state in zip(slot.stateful, slot.stateful_states):
            obj.load_state_dict(copy.deepcopy(state))
        slot.rng.restore()

    def _detach_idle(self, group: Any) -> None:
        """Runs out of the rotation (stopped, finished, failed, deleted) leave the shared
        model's module tree; their parameter objects stay with them (see
        ``ModelGroup.detach``). ``activate`` brings one back when it is needed."""
        for other in self.slots.values():
            if (other.group is group and other.adapter is not None
                    and not other.residency.resident and not other.state.status.schedulable):
                group.detach(other.adapter)

    def switch_out(self, slot: RunSlot) -> None:
        slot.rng = RngState.capture()
        slot.accelerate = snapshot_accelerate_state()
        slot.stateful_states = [copy.deepcopy(obj.state_dict()) for obj in slot.stateful]

    def load_final(self, slot: RunSlot) -> None:
        """After ``slot`` (finished elsewhere) was switched in: its final weights and trainer
        state from disk become its live ones."""
        slot.trainer.rf_load_final(slot.final_dir, slot.disk_state)
        slot.weights = WeightsAt.LIVE
        slot.local_chunks = slot.state.chunks_done

    # ------------------------------------------------------------------ parking and dropping

    def park(self, slot: RunSlot) -> None:
        """Park ``slot``'s tensors now (a stopped run) instead of at the next switch."""
        self._idle.pop(slot.name, None)
        slot.residency.park(self.cache, slot.trainer.optimizer)
        if self.resident is slot:
            self.resident = None

    def drop(self, slot: RunSlot) -> None:
        """Forget a failed run's tensors."""
        self._idle.pop(slot.name, None)
        slot.residency.drop(self.cache)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # after an out-of-memory error, give the rest back
        if self.resident is slot:
            self.resident = None

    def forget(self, slot: RunSlot) -> None:
        """Unwind a deleted (or policy-failed) run's ``train()`` and forget its tensors."""
        if slot.coroutine is not None and not slot.coroutine.finished:
            slot.coroutine.abort()
        self._idle.pop(slot.name, None)
        slot.residency.drop(self.cache)
        if self.resident is slot:
            self.resident = None

    def abort_suspended(self) -> None:
        # Runs left suspended (the loop was interrupted) unwind their train() calls now.
        for slot in self.slots.values():
            if slot.coroutine is not None and not slot.coroutine.finished:
                slot.coroutine.abort()

    def remove_checkpoints(self, slot: RunSlot) -> None:
        """A completed run's boundary checkpoints go (its final weights are written), by the
        writer thread: ~2 ms of the switch on the tiny model, more with a real one."""
        inside(self.output_dir, slot.checkpoints)
        self._writer.submit(shutil.rmtree, slot.checkpoints, ignore_errors=True)

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
        if slot.coroutine is not None:
            if not slot.coroutine.finished:
                slot.coroutine.abort()
            slot.coroutine = None
            if self.rebuild is None:
                raise RuntimeError(f"{slot.name}: this experiment cannot rebuild a trainer")
            self.attach(slot, self.rebuild(slot))
        slot.resume_from = ckpt
        slot.weights = WeightsAt.CHECKPOINT
        slot.warm_optimizer_state = None  # a warm clone's start: its checkpoint supersedes it
        slot.warm_checkpoint = None
        slot.yielded_at = {step}
        slot.finished = False
        slot.local_chunks = done

