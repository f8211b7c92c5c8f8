"""From a built trainer to a run record: the run's chunk plan, its :class:`RunSlot`, and the
record of a run that failed before it could train."""

from __future__ import annotations

import math
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..chunks import ChunkPlan, plan_chunks, training_steps
from ..models import ModelGroup
from ..residency import Residency
from .records import RunSlot

__all__ = ["new_slot", "plan_for", "register_failed"]


def plan_for(
    name: str, num_batches: int, args: Any, *, total_steps: int | None = None,
    step_multiple: int = 1,
) -> ChunkPlan:
    """The chunk plan of a run whose dataloader has ``num_batches`` batches per epoch."""
    num_chunks = getattr(args, "_rf_num_chunks", 1)
    spe, total = training_steps(
        num_batches, args.gradient_accumulation_steps, args.num_train_epochs, args.max_steps
    )
    with warnings.catch_warnings():
        # Said once, when the run is registered; the re-plan from the real dataloader
        # must not repeat it.
        if total_steps is not None:
            warnings.simplefilter("ignore", UserWarning)
        return plan_chunks(spe, total_steps or total, num_chunks, run=name,
                           step_multiple=step_multiple)


def _num_batches(trainer: Any, gang: int) -> int:
    """Batches per epoch of ``trainer``'s dataloader, before the Trainer has built it."""
    args = trainer.args
    dataset = trainer.train_dataset
    if hasattr(trainer, "_rf_num_batches"):
        num_batches = trainer._rf_num_batches()
    elif hasattr(dataset, "__len__"):
        batch = args.per_device_train_batch_size
        n = len(dataset)
        num_batches = n // batch if args.dataloader_drop_last else math.ceil(n / batch)
    else:
        num_batches = max(args.max_steps, 1) * args.gradient_accumulation_steps
    if gang > 1 and args.max_steps <= 0:
        # Each member sees its shard of the batches (accelerate's even split); the plan
        # must be right before train() starts, for a run continued from its checkpoint.
        num_batches = (num_batches // gang if args.dataloader_drop_last
                       else math.ceil(num_batches / gang))
    return num_batches


def new_slot(
    trainer: Any, *, name: str, params: Sequence[torch.nn.Parameter], num_chunks: int,
    gang: int = 0, **fields: Any,
) -> RunSlot:
    """The record of a run with a freshly built trainer (not attached to it yet); ``fields``:
    the rest of the record's fields (``index``, ``knobs``, ``group``, ``run_dir``, ...)."""
    trainer.args._rf_num_chunks = num_chunks
    num_batches = _num_batches(trainer, gang)
    step_multiple = getattr(trainer, "_rf_step_multiple", lambda: 1)()
    slot = RunSlot(
        name=name, trainer=trainer, residency=Residency(key=name, params=list(params)),
        plan=plan_for(name, num_batches, trainer.args, step_multiple=step_multiple),
        step_multiple=step_multiple, gang=gang, **fields,
    )
    if gang:
        # Its own model (sharded by its trainer) stays where it is: nothing to park.
        slot.residency.resident = False
    return slot


def register_failed(
    slots: dict[str, RunSlot], *, name: str, index: int, knobs: dict[str, Any], run_dir: Path,
    group: ModelGroup | None, error: BaseException, stacklevel: int,
) -> RunSlot:
    """Record in ``slots`` a run that failed before training (its trainer could not be built,
    or a clone could not be rebuilt) and say so; the others go on. ``stacklevel``: the
    warning's, as seen from here."""
    slot = RunSlot(
        name=name, index=index, knobs=knobs, trainer=None, group=group, adapter=None,
        residency=Residency(key=name, params=[]), plan=ChunkPlan(0, 0, 0, ()),
        run_dir=Path(run_dir), finished=True,
    )
    slot.error = "".join(traceback.format_exception_only(type(error), error)).strip()
    slot.error_traceback = "".join(
        traceback.format_exception(type(error), error, error.__traceback__)
    )
    slot.state.fail(slot.error)
    slots[name] = slot
    warnings.warn(f"{name} failed before training: {slot.error}", RuntimeWarning,
                  stacklevel=stacklevel)
    return slot
