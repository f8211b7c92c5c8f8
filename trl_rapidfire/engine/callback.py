"""The chunk-boundary callback every run's trainer gets, and the little it needs from the
engine (:class:`TurnHost`)."""

from __future__ import annotations

import time
from typing import Any, Protocol

from transformers import TrainerCallback

from ..runtime.switch import RngState
from .chunks import ChunkPlan
from .divergence import check_finite
from .records import RunSlot

__all__ = ["ChunkCallback", "TurnHost"]


class TurnHost(Protocol):
    """What :class:`ChunkCallback` asks of the engine, from inside a run's ``train()``."""

    # The experiment's runs (how many decides whether a diverged run stops: divergence.py).
    slots: dict[str, RunSlot]

    def save_boundary(self, slot: RunSlot) -> None:
        """Write the run's checkpoint of the boundary just reached."""

    def end_turn(self, slot: RunSlot) -> None:
        """Suspend the run's coroutine until its next turn."""

    def load_warm_optimizer_state(self, slot: RunSlot) -> None:
        """Give a warm clone's new optimizer its parent's moments."""

    def plan_for(
        self, name: str, num_batches: int, args: Any, *, num_chunks: int,
        total_steps: int | None = None, step_multiple: int = 1,
    ) -> ChunkPlan:
        """The chunk plan of a run whose dataloader has ``num_batches`` batches per epoch."""

    def replanned(self) -> None:
        """A run's plan changed (the experiment's chunk count with it)."""

    def evaluates_after(self, slot: RunSlot, chunks: int) -> bool:
        """Whether the run is evaluated at the end of its chunk number ``chunks`` (1-based)."""

    def evaluated(self, slot: RunSlot, seconds: float) -> None:
        """The run's chunk-end evaluation took ``seconds``."""


class ChunkCallback(TrainerCallback):
    """Added to every run's trainer: ends the run's turn at each chunk boundary.

    The turn ends at the first ``on_step_begin`` after a boundary, so everything the boundary
    step triggers (logging, evaluation, checkpoints, epoch-end work) happens in the run's own
    turn. A chunk boundary is not an epoch end: the callback never touches epoch control.
    """

    def __init__(self, host: TurnHost, slot: RunSlot) -> None:
        self.host = host
        self.slot = slot

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        slot = self.slot
        if slot.warm.optimizer_state is not None:
            self.host.load_warm_optimizer_state(slot)
        if slot.warm.checkpoint is not None:
            if state.global_step == 0:
                slot.live_trainer().rf_warm_start_from(slot.warm.checkpoint)
            slot.warm.checkpoint = None
        batches = _length(train_dataloader)
        if batches is not None:
            # The dataloader the Trainer built is the truth (GRPO repeats every generation
            # batch, a sampler may drop batches): plan from it before the first step.
            plan = self.host.plan_for(
                slot.name, batches, args, num_chunks=slot.num_chunks,
                total_steps=state.max_steps, step_multiple=slot.step_multiple,
            )
            if plan != slot.plan:
                slot.plan = plan
                self.host.replanned()

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Kept in memory; the engine hands a chunk's points to the tracker when the chunk ends.
        now = int(time.time() * 1000)
        step = int(state.global_step)
        for key, value in (logs or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.slot.turn.points.append((key, float(value), step, now))

    def on_epoch_end(self, args, state, control, **kwargs):
        if state.global_step in self.slot.plan.boundaries:
            # On resume the Trainer puts the random streams back *before* the next epoch
            # shuffles its data: a boundary at an epoch end records them as of now.
            self.slot.turn.epoch_end_rng = (state.global_step, RngState.capture())

    def on_step_begin(self, args, state, control, **kwargs):
        slot = self.slot
        step = state.global_step
        if step in slot.plan.boundaries and step not in slot.turn.yielded_at:
            slot.turn.yielded_at.add(step)
            # A run gone to inf/nan fails here, before its state is kept (divergence.py).
            check_finite(slot, step, runs=len(self.host.slots))
            # Here the next step's batches are fetched and nothing else has moved: exactly
            # where train(resume_from_checkpoint=...) restores a mid-epoch checkpoint.
            self.host.save_boundary(slot)
            self.host.end_turn(slot)

    def on_step_end(self, args, state, control, **kwargs):
        slot = self.slot
        chunks = slot.plan.chunks_at.get(state.global_step)
        if chunks is not None:
            if self.host.evaluates_after(slot, chunks):
                control.should_evaluate = True
                # Evaluation must not move the run's random streams.
                slot.turn.eval_rng = RngState.capture()
                slot.turn.eval_asked = time.perf_counter()
            if slot.chunk_save:
                control.should_save = True

    def on_evaluate(self, args, state, control, **kwargs):
        turn = self.slot.turn
        if turn.eval_rng is not None:
            turn.eval_rng.restore()
            turn.eval_rng = None
            self.host.evaluated(self.slot, time.perf_counter() - turn.eval_asked)


def _length(dataloader: Any) -> int | None:
    """Batches per epoch of ``dataloader``; ``None`` for streamed data (an
    ``IterableDataset``: accelerate's loaders define ``__len__`` and raise)."""
    if dataloader is None:
        return None
    try:
        return len(dataloader)
    except TypeError:
        return None
