"""The chunk plan: where each run's training is cut so that runs can take turns.

Every epoch of a run is cut into ``num_chunks`` contiguous, near-equal spans of that run's own
*optimizer steps*, in the order plain TRL would take them. Cutting each epoch the same way (not
the run's total steps) means runs with equal batch settings see the same examples in chunk k of
every epoch, and a chunk boundary never straddles an epoch end.

Steps per epoch and total steps follow transformers' ``Trainer`` exactly (see
:func:`training_steps`), including ``max_steps`` that ends mid-epoch: the last, partial epoch
is cut into ``num_chunks`` spans of its own length, so it takes turns like the others.

A plan is counted before it is built: one over ``MAX_PLAN_CHUNKS`` chunks or
``MAX_TRAIN_STEPS`` steps (:mod:`trl_rapidfire.config.plan_limits`) is a
:class:`ChunkPlanError` naming the limit, never minutes and gigabytes of chunks made on the
training thread while every other run and op waits.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import cached_property

from ..config.plan_limits import MAX_NUM_CHUNKS, MAX_PLAN_CHUNKS, MAX_TRAIN_STEPS

__all__ = ["Chunk", "ChunkPlan", "ChunkPlanError", "plan_chunks", "training_steps"]


class ChunkPlanError(ValueError):
    """The chunk plan cannot be made from these numbers; the message says which and why."""


@dataclass(frozen=True, slots=True)  # a plan holds up to MAX_PLAN_CHUNKS of them: no __dict__
class Chunk:
    """One turn of a run: optimizer steps ``[start_step, end_step)`` of epoch ``epoch``.

    ``index`` counts chunks within the epoch (0-based); ``number`` over the whole run.
    """

    epoch: int
    index: int
    number: int
    start_step: int
    end_step: int

    @property
    def steps(self) -> int:
        return self.end_step - self.start_step


@dataclass(frozen=True)
class ChunkPlan:
    """The chunks of one run, in training order.

    Attributes:
        steps_per_epoch: optimizer steps in one full epoch.
        total_steps: optimizer steps of the whole run (``max_steps`` as the Trainer computes it).
        num_chunks: chunks per full epoch actually used (may be lower than asked, see
            :func:`plan_chunks`).
        chunks: every chunk, epoch by epoch.
    """

    steps_per_epoch: int
    total_steps: int
    num_chunks: int
    chunks: tuple[Chunk, ...]

    @cached_property
    def boundaries(self) -> tuple[int, ...]:
        """Global steps at which a chunk ends (the last one is ``total_steps``)."""
        return tuple(c.end_step for c in self.chunks)

    @cached_property
    def chunks_at(self) -> dict[int, int]:
        """Global step at a chunk's end -> chunks done by then (1-based): asked at every
        step, so made once per plan."""
        return {c.end_step: i + 1 for i, c in enumerate(self.chunks)}

    def chunk_at(self, global_step: int) -> Chunk | None:
        """The chunk that starts at ``global_step`` or contains it; None when training is done."""
        for chunk in self.chunks:
            if chunk.start_step <= global_step < chunk.end_step:
                return chunk
        return None

    def __len__(self) -> int:
        return len(self.chunks)


def training_steps(
    num_batches: int,
    gradient_accumulation_steps: int,
    num_train_epochs: float,
    max_steps: int = -1,
) -> tuple[int, int]:
    """``(steps_per_epoch, total_steps)`` exactly as transformers' ``Trainer`` computes them.

    Args:
        num_batches: length of the run's training dataloader (micro-batches per epoch).
        gradient_accumulation_steps: micro-batches per optimizer step.
        num_train_epochs: may be fractional.
        max_steps: if positive, overrides ``num_train_epochs``.
    """
    if num_batches < 1:
        raise ChunkPlanError(f"The training dataloader is empty ({num_batches} batches).")
    if gradient_accumulation_steps < 1:
        raise ChunkPlanError(
            f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}."
        )
    # A final partial accumulation group still makes an optimizer step (as in the Trainer).
    steps_per_epoch = max(math.ceil(num_batches / gradient_accumulation_steps), 1)
    if max_steps > 0:
        return steps_per_epoch, max_steps
    if not math.isfinite(num_train_epochs):
        raise ChunkPlanError(f"num_train_epochs must be a finite number, got {num_train_epochs}.")
    total = math.ceil(num_train_epochs * steps_per_epoch)
    if total < 1:
        raise ChunkPlanError(
            f"num_train_epochs={num_train_epochs} gives no optimizer step "
            f"({steps_per_epoch} per epoch)."
        )
    return steps_per_epoch, total


def _cuts(steps: int, parts: int, multiple: int) -> list[int]:
    """Ends of ``parts`` near-equal spans of ``steps``, each end a multiple of ``multiple``
    (except the last, which is ``steps``)."""
    units, tail = divmod(steps, multiple)
    base, extra = divmod(units, parts)
    ends, at = [], 0
    for k in range(parts):
        # Earlier spans take the extra units, so spans differ by at most one unit.
        at += (base + (1 if k < extra else 0)) * multiple
        ends.append(at)
    ends[-1] += tail
    return ends


def _check_size(steps_per_epoch: int, total_steps: int, num_chunks: int, step_multiple: int,
                run: str) -> None:
    """Count the plan (full epochs, then a last partial one) before a chunk of it is made."""
    if num_chunks > MAX_NUM_CHUNKS:  # an epoch's cuts are a list of this length
        raise ChunkPlanError(
            f"{run}: num_chunks={num_chunks:,} is over the limit of {MAX_NUM_CHUNKS:,} "
            "(MAX_NUM_CHUNKS in trl_rapidfire.config.plan_limits); use fewer chunks an epoch.")
    if total_steps > MAX_TRAIN_STEPS:
        raise ChunkPlanError(
            f"{run}: {total_steps:,} optimizer steps is over the limit of {MAX_TRAIN_STEPS:,} "
            "(MAX_TRAIN_STEPS in trl_rapidfire.config.plan_limits); lower max_steps or "
            "num_train_epochs.")
    full, rest = divmod(total_steps, steps_per_epoch)
    count = full * num_chunks + (min(num_chunks, max(rest // step_multiple, 1)) if rest else 0)
    if count > MAX_PLAN_CHUNKS:
        raise ChunkPlanError(
            f"{run}: its plan would have {count:,} chunks ({full + bool(rest):,} epochs of "
            f"{steps_per_epoch:,} steps, cut into {num_chunks:,} chunks each), over the limit "
            f"of {MAX_PLAN_CHUNKS:,} (MAX_PLAN_CHUNKS in trl_rapidfire.config.plan_limits); "
            "train fewer epochs or set max_steps, or lower num_chunks.")


def plan_chunks(
    steps_per_epoch: int,
    total_steps: int,
    num_chunks: int,
    *,
    step_multiple: int = 1,
    run: str = "run",
) -> ChunkPlan:
    """Cut a run's training into chunks.

    Args:
        steps_per_epoch: optimizer steps in a full epoch.
        total_steps: optimizer steps of the whole run.
        num_chunks: chunks per epoch asked for.
        step_multiple: chunk boundaries inside an epoch fall on multiples of this many steps
            (GRPO rounds chunks to whole generation cycles).
        run: the run's name, for messages.

    More chunks than an epoch has units (``steps_per_epoch // step_multiple``) cannot be cut
    into non-empty spans: ``num_chunks`` is lowered to that and a ``UserWarning`` says so. An
    epoch cut short by ``max_steps`` is cut into ``num_chunks`` spans of its own length (fewer
    if it has fewer steps), so a run shorter than one epoch still takes turns.
    """
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ChunkPlanError(f"num_chunks must be an integer >= 1, got {num_chunks!r}.")
    if step_multiple < 1:
        raise ChunkPlanError(f"step_multiple must be >= 1, got {step_multiple}.")
    if steps_per_epoch < 1 or total_steps < 1:
        raise ChunkPlanError(
            f"{run}: nothing to train (steps_per_epoch={steps_per_epoch}, "
            f"total_steps={total_steps})."
        )
    units = max(steps_per_epoch // step_multiple, 1)
    if num_chunks > units:
        what = "optimizer steps" if step_multiple == 1 else f"blocks of {step_multiple} steps"
        warnings.warn(
            f"{run}: num_chunks={num_chunks} but an epoch has only {units} {what}; using "
            f"num_chunks={units}.",
            UserWarning,
            stacklevel=2,
        )
        num_chunks = units
    _check_size(steps_per_epoch, total_steps, num_chunks, step_multiple, run)
    full_epoch_ends = _cuts(steps_per_epoch, num_chunks, step_multiple)
    chunks: list[Chunk] = []
    epoch = 0
    while epoch * steps_per_epoch < total_steps:
        offset = epoch * steps_per_epoch
        steps = min(steps_per_epoch, total_steps - offset)
        if steps == steps_per_epoch:
            ends = full_epoch_ends
        else:
            # An epoch cut short by max_steps (or a fractional num_train_epochs) is cut into
            # chunks of its own length: max_steps below one epoch still interleaves the runs.
            parts = min(num_chunks, max(steps // step_multiple, 1))
            ends = _cuts(steps, parts, step_multiple)
        start = offset
        for index, end in enumerate(ends):
            chunks.append(Chunk(epoch, index, len(chunks), start, offset + end))
            start = offset + end
        epoch += 1
    return ChunkPlan(steps_per_epoch, total_steps, num_chunks, tuple(chunks))
