"""Keeping accelerate's process-global state valid while configs are built.

Every ``TrainingArguments.__post_init__`` reads ``self.device``, which clears accelerate's
process-global ``AcceleratorState`` (and re-creates only ``PartialState``). A trainer built
earlier then fails at ``train()`` with ``'AcceleratorState' object has no attribute
'distributed_type'``. trl-rapidfire builds many configs (one per run, for validation, for
clones mid-flight), so every such build goes through :func:`preserved_accelerate_state`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from accelerate.state import AcceleratorState, GradientState, PartialState

_STATES = (PartialState, AcceleratorState, GradientState)


@contextlib.contextmanager
def preserved_accelerate_state() -> Iterator[None]:
    """Run the body, then put back accelerate's shared state if it was set before.

    When nothing was initialised before (no trainer exists yet), whatever the body set up is
    kept: that is what building a plain TRL config does, and the next trainer re-initialises it.
    """
    saved = [dict(cls._shared_state) for cls in _STATES]
    try:
        yield
    finally:
        for cls, before in zip(_STATES, saved):
            if before:
                cls._shared_state.clear()
                cls._shared_state.update(before)
