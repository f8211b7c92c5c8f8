"""From a built trainer to a run record: the run's chunk plan, its :class:`RunSlot`, the
record of a run that failed before it could train, and :class:`RunRegistry`, which registers
runs built now and runs built when first scheduled."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..runtime.models import ModelGroup
from ..runtime.residency import Residency
from ..runtime.switch import inside_a_run
from ..storage.layout import Layout
from ..storage.names import check_run_name, inside
from .chunks import ChunkPlan, plan_chunks, training_steps
from .records import Outcome, RunSlot
from .run_trainer import NewRun, PlannedRun, RunFactory, RunTrainer

__all__ = ["RunRegistry", "new_slot", "plan_for", "register_failed"]


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


class RunRegistry:
    """Registers the engine's runs: built now (:meth:`register`), or planned now and built
    when first scheduled (:meth:`register_planned`, then :meth:`build`).

    Building a run's trainer is most of what an experiment costs before its first chunk
    (~10 ms a run on the tiny model: TRL's and transformers' constructors, PEFT's adapter
    injection), so a run whose plan is known without it waits for its first turn: the first
    metric no longer waits for every run's trainer.

    Args:
        layout: the experiment's paths (every run's folder is checked to be inside it).
        slots: the engine's runs (shared, not copied).
        runs: builds planned runs' trainers (``None``: no run can be planned).
        attach: the turns' ``attach`` (a trainer's starting point, taken right after it is
            built).
        ensure_run: the reporter's ``ensure_run`` (the run's tracking run).
        replanned: told when a built run's plan differs from the one it was planned with.
    """

    def __init__(self, *, layout: Layout, slots: dict[str, RunSlot], runs: RunFactory | None,
                 attach: Callable[[RunSlot, RunTrainer], None],
                 ensure_run: Callable[[str, dict[str, Any], dict[str, str]], None],
                 replanned: Callable[[], None]) -> None:
        self.layout = layout
        self.slots = slots
        self._runs = runs
        self._attach = attach
        self._ensure_run = ensure_run
        self._replanned = replanned

    def register(self, new: NewRun) -> RunSlot:
        """Register a freshly built run (``new.gang``: trained by that many workers together,
        e.g. FSDP; its trainer was built in the launch's world), and open its tracking run.
        Call right after building the trainer: its RNG streams and accelerate's state are
        captured now, as the run's starting point (what they would be in a script that built
        this trainer alone and then called ``train()``)."""
        check_run_name(new.name)
        inside(self.layout.output_dir, new.run_dir)  # names come from files too: never outside
        slot = new_slot(new, checkpoints=self.layout.checkpoints(new.name),
                        final_dir=self.layout.final_dir(new.name))
        self._attach(slot, new.trainer)
        self.slots[new.name] = slot
        self._ensure_run(new.name, new.tracked, new.tags)
        return slot

    def register_planned(self, planned: PlannedRun) -> RunSlot:
        """Register a run whose trainer is built when it is first scheduled (or first needed:
        :meth:`build`), and open its tracking run."""
        if self._runs is None:
            raise RuntimeError("this experiment cannot build runs later: register them built")
        # Its folder is the layout's for a name the search made (the layout refused a link
        # out of output_dir when it gave it): only the name is checked here, which is what a
        # thousand planned runs can afford before their first chunk.
        check_run_name(planned.name)
        slot = RunSlot(
            name=planned.name, index=planned.index, knobs=planned.knobs, trainer=None,
            group=None, adapter=None,
            residency=Residency(key=planned.name, params=[], resident=False),
            plan=planned.plan, run_dir=Path(planned.run_dir), evaluation=planned.evaluation,
            chunk_save=planned.chunk_save, num_chunks=planned.num_chunks,
            checkpoints=self.layout.checkpoints(planned.name),
            final_dir=Path(planned.run_dir) / "final", planned=True,
        )
        self.slots[planned.name] = slot
        self._ensure_run(planned.name, planned.tracked, planned.tags)
        return slot

    def add_failed(self, *, name: str, index: int, knobs: dict[str, Any], run_dir: Path,
                   group: ModelGroup | None, error: BaseException) -> RunSlot:
        """Register a run whose trainer could not be built (e.g. its formatting function
        raised while the dataset was prepared): it is failed from the start, the others go on."""
        return register_failed(self.slots, name=name, index=index, knobs=knobs,
                               run_dir=run_dir, group=group, error=error, stacklevel=4)

    def build(self, slot: RunSlot) -> None:
        """Build ``slot``'s trainer if it was planned (else nothing): between turns, never
        inside a run's ``train()`` (its RNG streams, accelerate state and active adapter are
        the running run's there). Its starting point is taken right after, as for a run built
        up front. Raises what the build raised (nothing of it is left behind)."""
        if not slot.planned:
            return
        if inside_a_run():
            raise RuntimeError(f"{slot.name}'s trainer is built when it is first scheduled; "
                               "it cannot be built from inside another run's training")
        assert self._runs is not None  # register_planned refuses otherwise
        try:
            new = self._runs.build_planned(slot.name)
        except BaseException:
            self._runs.undo(slot.name)
            slot.planned = False  # failed before training: it has no trainer, and gets none
            raise
        built = new_slot(new, checkpoints=slot.checkpoints or self.layout.checkpoints(new.name),
                         final_dir=slot.final_dir)
        slot.group, slot.adapter, slot.residency = built.group, built.adapter, built.residency
        slot.step_multiple, slot.planned = built.step_multiple, False
        if built.plan != slot.plan and not slot.state.chunks_done:
            slot.plan = built.plan  # the factory vouched for it; its trainer says otherwise
            self._replanned()
        self._attach(slot, new.trainer)
