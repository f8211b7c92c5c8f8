"""The seam between the engine and the trainer layer, declared.

The engine drives a run's trainer through :class:`RunTrainer` only, and gets new trainers
(a rebuild on another worker, a clone) through the :class:`RunFactory` it is constructed with.
What the factory builds comes back as a :class:`NewRun`, which the engine registers itself; a
run whose trainer is built when it is first scheduled is registered as a :class:`PlannedRun`
and built through the factory then.
This module imports nothing from ``trl_rapidfire.trainers``: the trainers depend on the
engine, never the other way round.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..runtime.models import ModelGroup

if TYPE_CHECKING:
    from transformers import TrainerState, TrainingArguments

    from ..control.ops import Op
    from ..runtime.switch import RngState
    from .chunks import ChunkPlan
    from .records import RunSlot

__all__ = ["EvalCadence", "NewRun", "PlannedRun", "RunFactory", "RunTrainer"]


class EvalCadence(enum.Enum):
    """Where the engine evaluates a run (``eval_strategy`` as the user wrote it; TRL's own
    strategies are TRL's, and the engine leaves those runs to it)."""

    # Not by the engine (TRL's eval_strategy, "no" or "steps"/"epoch", does what it says).
    NONE = "none"
    # At every chunk end ("chunk").
    CHUNK = "chunk"
    # Where the experiment's policy reads the run's metric, and at the run's last chunk
    # ("policy"): the evaluations no decision reads are not paid for.
    POLICY = "policy"


class RunTrainer(Protocol):
    """One run's trainer, as the engine uses it: a TRL trainer (``train``, ``state``,
    ``optimizer``, ``save_model``, ...) plus the hooks below, which
    :class:`~trl_rapidfire.trainers.run_trainer.RunTrainerMixin` implements."""

    # The training stack's own types (taken as opaque by the type checker: see pyproject's
    # [tool.mypy]); the optimizer exists once train() has built it.
    args: TrainingArguments
    state: TrainerState
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    train_dataset: Any

    def train(self, resume_from_checkpoint: str | None = None) -> Any: ...

    def add_callback(self, callback: Any) -> None: ...

    def remove_callback(self, callback: Any) -> None: ...

    def pop_callback(self, callback: Any) -> Any: ...

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None: ...

    def get_decay_parameter_names(self, model: Any) -> list[str]: ...

    def rf_num_batches(self) -> int | None:
        """Batches per epoch of the dataloader ``train()`` will build, when it is not the
        dataset's length over the batch size (GRPO repeats every generation batch); else
        ``None``."""

    def rf_step_multiple(self) -> int:
        """Chunk boundaries fall on multiples of this many optimizer steps."""

    def rf_stateful(self) -> list[Any]:
        """Objects shared between runs that keep state (``state_dict``/``load_state_dict``):
        the engine gives each run back its own state at each turn."""

    def rf_save_boundary(self, target: Path, rng: RngState | None = None) -> Callable[[], Path]:
        """Start this run's checkpoint at a chunk boundary; the returned function finishes it
        (it may run on another thread while other runs train)."""

    def rf_save_gang_boundary(self, target: Path, rng: RngState | None = None) -> Path:
        """A gang run's checkpoint at a chunk boundary, written now by every member."""

    def rf_warm_start_from(self, checkpoint: Path) -> None:
        """Inside ``train()``, before the first step: start from another run's weights and
        optimizer moments in ``checkpoint``, keeping this run's own hyperparameters."""

    def rf_load_final(self, folder: Path, state: Any) -> None:
        """Make the final weights in ``folder`` (written by another worker) and the trainer
        state ``state`` this trainer's live ones."""


@dataclass
class NewRun:
    """A run the factory built, for the engine to register (``Engine.registry.register``).

    ``resident``: whether its trainable tensors are the ones in the model now (a new adapter,
    the first full fine-tuning run of a model) or must be swapped in at its first turn.
    ``params``: what the tracker records as the run's parameters; ``tags``: its first tags.
    """

    name: str
    index: int
    knobs: dict[str, Any]
    trainer: RunTrainer
    group: ModelGroup | None
    adapter: str | None
    params: Sequence[torch.nn.Parameter]
    num_chunks: int
    run_dir: Path
    evaluation: EvalCadence = EvalCadence.NONE
    chunk_save: bool = False
    gang: int = 0
    resident: bool = True
    tracked: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class PlannedRun:
    """A run registered before its trainer exists (``Engine.registry.register_planned``): built
    by the factory's :meth:`RunFactory.build_planned` when it is first scheduled (or first
    needed). Its ``plan`` is known without the trainer (the factory vouches that it is what
    the built trainer's would be); the other fields are :class:`NewRun`'s."""

    name: str
    index: int
    knobs: dict[str, Any]
    plan: ChunkPlan
    num_chunks: int
    run_dir: Path
    evaluation: EvalCadence = EvalCadence.NONE
    chunk_save: bool = False
    tracked: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


class RunFactory(Protocol):
    """Builds trainers for the engine (the trainer layer implements it)."""

    def rebuild(self, slot: RunSlot) -> RunTrainer:
        """A fresh trainer for ``slot``, on the same model and adapter, to continue from its
        checkpoint (it was trained by another worker, or by the process before a crash)."""

    def clone(self, parent: RunSlot, op: Op, *, name: str, trusted: bool) -> NewRun:
        """Build the run ``name`` that ``op`` (a clone or clone-warm of ``parent``) asks for.
        ``trusted``: the op is the script's own; else it may change hyperparameters only (see
        :mod:`trl_rapidfire.storage.names`). Raises :class:`~trl_rapidfire.control.ops.OpError`
        when the
        clone cannot be built (nothing is left behind)."""

    def new(self, name: str, knobs: dict[str, Any]) -> NewRun:
        """Build the run ``name`` with these knob values chosen (an adaptive search's
        proposal), as the search's expansion would have built it. Raises when it cannot be
        built (nothing is left behind)."""

    def build_planned(self, name: str) -> NewRun:
        """Build the run ``name`` registered as a :class:`PlannedRun`, as it would have been
        built up front. Raises when it cannot be built (nothing is left behind)."""

    def undo(self, name: str) -> None:
        """Take back a run built by :meth:`clone`, :meth:`new` or :meth:`build_planned` that
        the engine could not use."""
