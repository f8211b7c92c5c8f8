"""A run whose loss or weights stop being finite has failed, and says so.

With a learning rate far too high, a run's weights overflow to ``inf``/``nan`` within a step
or two. The Trainer does not stop it: ``logging_nan_inf_filter`` (on by default) logs a finite
stand-in for a ``nan`` loss (``0.0`` once nothing finite came before), so such a run would
"complete", look best by its logged loss, and hand back an adapter of ``nan``. At every chunk
boundary (and at the end of training) the run's logged values since its last boundary and the
parameters its optimizer trains are checked; the first non-finite one fails the run alone,
with a reason a person can act on. The check is a few fused reductions over the run's own
trained parameters (an adapter: microseconds), nothing that grows with other runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .records import RunSlot

__all__ = ["RunDiverged", "check_finite", "divergence"]

# Logged values that are never legitimately non-finite in a healthy run.
_WATCHED = ("loss", "grad_norm", "eval_loss")


class RunDiverged(RuntimeError):
    """The run's loss or weights are no longer finite numbers."""


def _trained_tensors(trainer: Any) -> list[torch.Tensor]:
    optimizer = getattr(trainer, "optimizer", None)
    if optimizer is None:
        return []
    return [p for group in optimizer.param_groups for p in group["params"]
            if isinstance(p, torch.Tensor) and type(p) in (torch.Tensor, torch.nn.Parameter)]


def divergence(slot: RunSlot, step: int) -> str | None:
    """Why ``slot``'s run has diverged by ``step`` (``"loss is nan at step 12"``), or
    ``None`` while everything it logged since its last report and every parameter it trains
    is finite."""
    for key, value, at, _ in slot.turn.points:
        if key in _WATCHED and not math.isfinite(value):
            return f"{key} is {value} at step {at}"
    if slot.gang:  # sharded tensors: their norms are collectives; the logged values tell
        return None
    tensors = _trained_tensors(slot.trainer)
    if not tensors:
        return None
    with torch.no_grad():
        # One norm over all of them (fused per device): inf or nan anywhere makes it so.
        total = torch.nn.utils.get_total_norm([t.detach() for t in tensors])
    if bool(total.isfinite()):
        return None
    return f"its weights are not finite (inf or nan) at step {step}"


def check_finite(slot: RunSlot, step: int) -> None:
    """Raise :class:`RunDiverged` if ``slot``'s run has diverged (see :func:`divergence`)."""
    reason = divergence(slot, step)
    if reason is not None:
        raise RunDiverged(f"{slot.name} diverged: {reason}; its learning rate (or another "
                          "setting) is likely too large")
