"""The wall around process-global state: accelerate's singletons, for every trainer in the
process and for every experiment after another in it.

Nothing else in the package saves, clears or rebuilds accelerate's state (the launch's
environment variables are :mod:`trl_rapidfire.workers`'; it calls in here for accelerate).

accelerate keeps its state in three process-wide singletons (``PartialState``,
``AcceleratorState``, ``GradientState``). Two things overwrite them behind a live trainer's back:

* every ``TrainingArguments.__post_init__`` reads ``self.device``, which clears
  ``AcceleratorState`` (re-creating only ``PartialState``); a trainer built earlier then fails at
  ``train()`` with ``'AcceleratorState' object has no attribute 'distributed_type'``. Building a
  config alone goes through :func:`preserved_accelerate_state`;
* every trainer builds an ``Accelerator``, which writes its own settings (gradient accumulation
  steps, dataloader references) into ``GradientState``. Runs that take turns in one process
  each keep a :func:`snapshot_accelerate_state` and get it back with
  :func:`restore_accelerate_state` before their next turn.

And one thing an experiment must not leave behind: ``AcceleratorState`` keeps the mixed
precision of the first ``Accelerator`` built after it was cleared, and refuses another one
("AcceleratorState has already been initialized"). A plain TRL script never meets this, because
every config clears the state just before its trainer is built; here configs are built long
before their trainers, so every run's trainer is built right after :func:`fresh_accelerator_state`,
and an experiment's setup and its ``train()`` calls run :func:`left_as_found`, so the next
experiment (or a plain TRL trainer) in the process finds the state as the script had it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from accelerate.state import AcceleratorState, GradientState, PartialState

__all__ = [
    "enter_world_of_one",
    "fresh_accelerator_state",
    "launch_partial_state",
    "left_as_found",
    "preserved_accelerate_state",
    "reset_for_launch_world",
    "restore_accelerate_state",
    "snapshot_accelerate_state",
    "without_barriers",
]

_STATES = (PartialState, AcceleratorState, GradientState)

AccelerateSnapshot = list[dict[str, Any]]


def _copy_value(value: Any) -> Any:
    # GradientState keeps its dataloader references in a list and its plugin settings in a dict,
    # both changed in place: a snapshot needs its own containers, not just its own dict.
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def snapshot_accelerate_state() -> AccelerateSnapshot:
    """A copy of accelerate's shared state as it is now."""
    return [{k: _copy_value(v) for k, v in cls._shared_state.items()} for cls in _STATES]


def restore_accelerate_state(snapshot: AccelerateSnapshot, *, keep_empty: bool = False) -> None:
    """Put back a :func:`snapshot_accelerate_state`.

    With ``keep_empty``, a singleton that was not initialised in the snapshot keeps whatever it
    holds now instead of being cleared.
    """
    for cls, saved in zip(_STATES, snapshot):
        if keep_empty and not saved:
            continue
        cls._shared_state.clear()
        cls._shared_state.update({k: _copy_value(v) for k, v in saved.items()})


@contextlib.contextmanager
def preserved_accelerate_state() -> Iterator[None]:
    """Run the body, then put back accelerate's shared state if it was set before.

    When nothing was initialised before (no trainer exists yet), whatever the body set up is
    kept: that is what building a plain TRL config does, and the next trainer re-initialises it.
    """
    saved = snapshot_accelerate_state()
    try:
        yield
    finally:
        restore_accelerate_state(saved, keep_empty=True)


@contextlib.contextmanager
def left_as_found() -> Iterator[None]:
    """Run the body, then put accelerate's state back exactly as it was (cleared, if it was):
    an experiment's setup and its training leave the process as the script had it."""
    saved = snapshot_accelerate_state()
    try:
        yield
    finally:
        restore_accelerate_state(saved)


def fresh_accelerator_state() -> None:
    """Clear ``AcceleratorState`` (the process's ``PartialState`` stays), as a TRL config's
    ``__post_init__`` leaves it right before a plain script builds that config's trainer: the
    trainer's ``Accelerator`` then takes its own settings, whatever was built before it."""
    AcceleratorState._reset_state(reset_partial_state=False)


def reset_for_launch_world() -> None:
    """Clear all of accelerate's process state, so the next ``TrainingArguments`` or
    ``Accelerator`` sets it up from the launch's environment (a gang run's world)."""
    AcceleratorState._reset_state(reset_partial_state=True)


def enter_world_of_one() -> None:
    """Make accelerate's state a world of one again if it is the launch's (a gang run's turn
    left it so), so that a single-device run's trainer built now is neither wrapped in DDP nor
    given the gang's FSDP plugin. A state that is already a world of one is kept."""
    distributed = bool(PartialState._shared_state) and PartialState().num_processes > 1
    if distributed or AcceleratorState._shared_state.get("fsdp_plugin") is not None:
        AcceleratorState._reset_state(reset_partial_state=True)


def launch_partial_state(config: Any) -> None:
    """accelerate's process state for the launch's world, as ``config`` set it up when it was
    built there (a gang run's trainer reads it through ``config.distributed_state``)."""
    from datetime import timedelta

    PartialState(cpu=config.use_cpu, backend=config.ddp_backend,
                 timeout=timedelta(seconds=config.ddp_timeout))


@contextlib.contextmanager
def without_barriers() -> Iterator[None]:
    """Build a gang run's trainer without the launch-wide barriers TRL puts around dataset
    preparation (``main_process_first``: the main process fills the datasets cache first).

    Each member builds a clone's trainer when it learns of the clone, and rebuilds a run's
    trainer when it claims the run, at its own time: a barrier there waits for a member that
    is training something else, or holds the shared state's lock, and never comes (a
    deadlock, seen with two workers). Without it every member prepares the data itself, which
    at worst repeats work the cache would have saved; the gang's collectives start only in
    ``train()``, after the members have met."""
    original = PartialState.wait_for_everyone
    PartialState.wait_for_everyone = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        PartialState.wait_for_everyone = original  # type: ignore[method-assign]
