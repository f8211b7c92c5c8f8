"""The runs that clone ops make: built by the trainer layer's :class:`~.run_trainer.RunFactory`,
registered by the engine, and (``clone-warm``) started from their parent's weights and
optimizer moments; or rebuilt from another worker's recipe in the shared state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..control.ops import Op, OpError, parse_op
from ..runtime.cache import StateCache, load_tree
from ..storage.checkpoints import checkpoint_at, link_folder, run_state_from_checkpoint
from ..storage.layout import Layout, run_index
from ..storage.names import UntrustedValue
from .records import RunSlot
from .run_trainer import NewRun, RunFactory

__all__ = ["Clones", "next_run_index"]


class Clones:
    """Makes clones (between two chunks, never while a run computes).

    Args:
        layout: the experiment's paths (a warm clone's starting state goes to its warm dir).
        slots: the engine's runs (a clone is added there by ``register``).
        cache: where parked run state lives (a warm clone copies its parent's from there).
        runs: builds the clone's trainer (``None``: this experiment cannot clone).
        register: registers a built run (:meth:`~.building.RunRegistry.register`).
        prepare: builds a planned run's trainer (:meth:`~.building.RunRegistry.build`): a
            parent whose state is read from its checkpoint needs one.
    """

    def __init__(
        self, *, layout: Layout, slots: dict[str, RunSlot], cache: StateCache,
        runs: RunFactory | None, register: Callable[[NewRun], RunSlot],
        prepare: Callable[[RunSlot], None] = lambda slot: None,
    ) -> None:
        self._prepare = prepare
        self.layout = layout
        self.slots = slots
        self.cache = cache
        self.runs = runs
        self._register = register

    def make(self, parent: RunSlot, op: Op, *, name: str, trusted: bool,
             warm_from: Path | None = None) -> RunSlot:
        """Build and register the clone ``name`` of ``parent`` that ``op`` asks for.

        ``warm_from``: its starting state as another worker (or an earlier session) wrote it;
        else a warm clone starts from the parent's state in this process. Raises
        :class:`OpError` when it cannot be made; nothing of it is left behind then."""
        if self.runs is None:
            raise OpError("this experiment cannot clone runs")
        if op.warm and warm_from is None and parent.state.chunks_done == 0:
            raise OpError(f"{parent.name} has not finished a chunk yet: nothing to warm-start "
                          "from; use `clone`, or wait for its first chunk")
        new = self.runs.clone(parent, op, name=name, trusted=trusted)
        new.tags.update({"rapidfire.parent": parent.name,
                         "rapidfire.warm_start": str(op.warm).lower()})
        try:
            slot = self._register(new)
        except Exception as err:  # noqa: BLE001 - reported as the op's result
            self._undo(name)
            raise OpError(f"could not build {name}: {type(err).__name__}: {err}") from None
        slot.state.parent = parent.name
        slot.state.warm_start = op.warm
        if op.warm:
            try:
                self._warm_start(slot, parent, warm_from)
            except OpError:
                self._undo(name)
                raise
        return slot

    def make_from_recipe(self, name: str, info: dict[str, str], *, trusted: bool) -> None:
        """Build the clone ``name`` from its recipe ``info`` in the shared state (another
        worker, or an earlier session, made it). Raises :class:`OpError` (or
        ``RuntimeError`` when its parent is unknown here)."""
        parent = self.slots.get(info["parent"])
        if parent is None or self.runs is None:
            raise RuntimeError(f"cannot build clone {name}: parent {info['parent']} unknown")
        warm = self.layout.warm_dir(name)
        self.make(parent, parse_op(info["op"]), name=name, trusted=trusted,
                  warm_from=warm if warm.is_dir() else None)

    def _undo(self, name: str) -> None:
        self.slots.pop(name, None)
        if self.runs is not None:
            self.runs.undo(name)

    # ------------------------------------------------------------------ warm starts

    def _warm_start(self, slot: RunSlot, parent: RunSlot, warm_from: Path | None) -> None:
        if slot.gang:
            # Its parent's checkpoint as of now, kept for the clone (the parent's own copy is
            # pruned as it trains on); every member loads it in the clone's first turn.
            if warm_from is None:
                warm_from = link_folder(self.last_checkpoint(parent),
                                        self.layout.warm_dir(slot.name))
            slot.warm.checkpoint = Path(warm_from)
            return
        if warm_from is not None:  # made by another worker, or before a re-run
            tree = load_tree(warm_from)
            values, states = list(tree["params"]), list(tree["optimizer"])
        else:
            values, states = self.parent_state(parent)
            slot.warm.state_tree = {"params": values, "optimizer": states}
        params = slot.residency.params
        if [tuple(p.shape) for p in params] != [tuple(v.shape) for v in values]:
            raise OpError(f"warm start of {slot.name} from {parent.name}: the trainable "
                          "parameters' shapes differ (adapter rank, targets or model changed); "
                          "use `clone` to train it from scratch")
        if slot.residency.resident:
            with torch.no_grad():
                for p, v in zip(params, values):
                    p.data.copy_(v.to(p.device))
        else:
            # Full fine-tuning: the clone's weights are swapped in at its first turn.
            slot.residency.park_values(self.cache, values)
        slot.warm.optimizer_state = states

    def parent_state(self, slot: RunSlot) -> tuple[list[torch.Tensor], list[Any]]:
        """Copies of ``slot``'s parameter values and per-parameter optimizer state, as of its
        last finished chunk (for a warm-started clone)."""
        optimizer = slot.trainer.optimizer if slot.trainer is not None else None
        if slot.state.chunks_done > slot.turn.local_chunks:
            # Trained by another worker or an earlier process: its state is its checkpoint.
            return self._state_on_disk(slot)
        try:
            return slot.residency.copy_state(self.cache, optimizer)
        except LookupError as err:
            raise OpError(f"{slot.name} has no weights to start from") from err

    def last_checkpoint(self, slot: RunSlot) -> Path:
        """``slot``'s checkpoint at its last finished chunk (to warm-start a clone from); if
        that chunk is volatile on another worker (``checkpoint_every``), at its last durable
        one."""
        steps = [slot.state.global_step] + ([slot.state.durable_step] if slot.state.volatile
                                            else [])
        found = [checkpoint_at(slot.checkpoints, s) for s in steps] if slot.checkpoints else []
        ckpt = next((c for c in found if c is not None), None)
        if ckpt is None:
            raise OpError(f"{slot.name} has no checkpoint at step {slot.state.global_step} to "
                          "warm-start from (a finished run keeps only its final weights); use "
                          "`clone`")
        return ckpt

    def _state_on_disk(self, slot: RunSlot) -> tuple[list[torch.Tensor], list[Any]]:
        ckpt = self.last_checkpoint(slot)
        try:
            self._prepare(slot)  # its parameters' names and decay groups come from its trainer
        except Exception as err:  # noqa: BLE001 - reported as the op's result
            raise OpError(f"cannot warm-start from {slot.name}: its trainer could not be "
                          f"built: {type(err).__name__}: {err}") from None
        group = slot.model_group()
        model = group.model
        if slot.adapter is not None:
            group.attach(slot.adapter)  # its parameters' names are read from the model
        own = {id(p) for p in slot.residency.params}
        named = [(n, p) for n, p in model.named_parameters() if id(p) in own]
        decay = set(slot.live_trainer().get_decay_parameter_names(model))
        try:
            return run_state_from_checkpoint(ckpt, named, slot.adapter, decay)
        except (LookupError, UntrustedValue) as err:  # UntrustedValue: a link or FIFO in it
            raise OpError(f"cannot warm-start from {slot.name}'s checkpoint: {err}") from None


def next_run_index(names: Any, slots: dict[str, RunSlot]) -> int:
    """The number of the next new run, after every run in ``names`` and ``slots``."""
    taken = {i for i in map(run_index, names) if i is not None}
    taken |= {s.index for s in slots.values()}
    return max(taken) + 1
