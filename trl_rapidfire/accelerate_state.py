"""Keeping accelerate's process-global state right for every trainer in the process.

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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from accelerate.state import AcceleratorState, GradientState, PartialState

__all__ = [
    "preserved_accelerate_state",
    "restore_accelerate_state",
    "snapshot_accelerate_state",
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
