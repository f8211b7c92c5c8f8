"""From a built trainer to a run record: the run's chunk plan, its :class:`RunSlot`, and the
record of a run that failed before it could train."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from ..runtime.models import ModelGroup
from ..runtime.residency import Residency
from .chunks import ChunkPlan, plan_chunks, training_steps
from .records import Outcome, RunSlot
from .run_trainer import NewRun, RunTrainer

__all__ = ["new_slot", "plan_for", "register_failed"]


def plan_for(
    name: str, num_batches: int, args: Any, *, num_chunks: int, total_steps: int | None = None,
    step_multiple: int = 1,
) -> ChunkPlan:
    """The chunk plan of a run whose dataloader has ``num_batches`` batches per epoch."""
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


def _num_batches(trainer: RunTrainer, gang: int) -> int:
    """Batches per epoch of ``trainer``'s dataloader, before the Trainer has built it."""
    args = trainer.args
    dataset = trainer.train_dataset
    num_batches = trainer.rf_num_batches()
    if num_batches is None and hasattr(dataset, "__len__"):
        batch = args.per_device_train_batch_size
        n = len(dataset)
        num_batches = n // batch if args.dataloader_drop_last else math.ceil(n / batch)
    elif num_batches is None:
        num_batches = max(args.max_steps, 1) * args.gradient_accumulation_steps
    if gang > 1 and args.max_steps <= 0:
        # Each member sees its shard of the batches (accelerate's even split); the plan
        # must be right before train() starts, for a run continued from its checkpoint.
        num_batches = (num_batches // gang if args.dataloader_drop_last
                       else math.ceil(num_batches / gang))
    return num_batches


def new_slot(new: NewRun, *, checkpoints: Path, final_dir: Path) -> RunSlot:
    """The record of a freshly built run (not attached to its trainer yet)."""
    trainer = new.trainer
    step_multiple = trainer.rf_step_multiple()
    plan = plan_for(new.name, _num_batches(trainer, new.gang), trainer.args,
                    num_chunks=new.num_chunks, step_multiple=step_multiple)
    slot = RunSlot(
        name=new.name, index=new.index, knobs=new.knobs, trainer=trainer, group=new.group,
        adapter=new.adapter, residency=Residency(key=new.name, params=list(new.params)),
        plan=plan, run_dir=Path(new.run_dir), evaluation=new.evaluation,
        chunk_save=new.chunk_save, step_multiple=step_multiple, num_chunks=new.num_chunks,
        gang=new.gang, checkpoints=checkpoints, final_dir=final_dir,
    )
    # A gang run's own model (sharded by its trainer) stays where it is: nothing to park.
    slot.residency.resident = new.resident and not new.gang
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
        run_dir=Path(run_dir), outcome=Outcome(finished=True),
    )
    slot.record_error(error)
    slot.state.fail(slot.failure)
    slots[name] = slot
    warnings.warn(f"{name} failed before training: {slot.outcome.error}", RuntimeWarning,
                  stacklevel=stacklevel)
    return slot
