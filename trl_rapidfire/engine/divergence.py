"""A run whose loss or weights stop being finite has diverged, and says so.

With a learning rate far too high, a run's weights overflow to ``inf``/``nan`` within a step
or two. The Trainer does not stop it: ``logging_nan_inf_filter`` (on by default) logs a finite
stand-in for a ``nan`` loss (``0.0`` once nothing finite came before), so such a run would
"complete", look best by its logged loss, and hand back an adapter of ``nan``. At every chunk
boundary (and at the end of training) the run's logged values since its last boundary and the
parameters its optimizer trains are checked; the first non-finite one fails the run alone,
with a reason a person can act on. The check is a few fused reductions over the run's own
trained parameters (an adapter: microseconds), nothing that grows with other runs.

Failing it is for comparing runs (a diverged run must not be "best", nor take turns from the
others). An experiment of one run is its TRL trainer alone, which trains on through
inf/nan (TRL's own tests train fp16 weights at lr 0.1 that overflow by step 2): there the run
is warned about once and trains on. The RF configs' ``stop_diverged`` chooses either way
(None, the default: fail it only when the experiment has several runs).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from ..config.fields import STOP_DIVERGED_ATTR
from .records import RunSlot

__all__ = ["RunDiverged", "check_finite", "divergence", "stops_diverged"]

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
        # inf or nan anywhere makes the sum so; one sum a tensor and one read at the end, at
        # every boundary (an L2 norm cost twice as much, and squares overflow sooner). Under
        # no_grad a sum records no graph: no detach() (a fifth of the check).
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for t in tensors:
            by_device.setdefault(t.device, []).append(t.sum(dtype=torch.float32))
        finite = all(bool(torch.stack(sums).sum().isfinite()) for sums in by_device.values())
    if finite:
        return None
    return f"its weights are not finite (inf or nan) at step {step}"


# Settings that are legitimately infinite: max_grad_norm=inf measures without clipping.
_MAY_BE_INFINITE = frozenset({"max_grad_norm"})


def _numbers_in(name: str, value: Any) -> Iterator[tuple[str, float]]:
    """``(name, number)`` for ``value`` and, for a config object (``LoraConfig``), each of
    its fields: one level, what a person sets."""
    if isinstance(value, float):
        yield name, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for fld in dataclasses.fields(value):
            inner = getattr(value, fld.name, None)
            if isinstance(inner, float):
                yield f"{name}.{fld.name}", inner


def bad_setting(slot: RunSlot) -> str | None:
    """The run's first setting that is not a finite number (``peft_config.lora_alpha is
    nan``), which makes a run diverge whatever its learning rate; or ``None``."""
    found: list[tuple[str, float]] = []
    for name, value in slot.knobs.items():
        found += _numbers_in(name, value)
    trainer = slot.trainer
    peft = getattr(getattr(trainer, "model", None), "peft_config", None)
    if isinstance(peft, dict) and slot.adapter in peft:
        found += _numbers_in("peft_config", peft[slot.adapter])
    args = getattr(trainer, "args", None)
    if dataclasses.is_dataclass(args):
        found += [(f.name, v) for f in dataclasses.fields(args)
                  if isinstance(v := getattr(args, f.name, None), float)]
    for name, value in found:
        if math.isnan(value) or (math.isinf(value) and name not in _MAY_BE_INFINITE):
            return f"{name} is {value}"
    return None


def stops_diverged(slot: RunSlot, runs: int) -> bool:
    """Whether ``slot``'s run fails when it diverges, in an experiment of ``runs`` runs: its
    config's ``stop_diverged``, and where that is ``None`` (the default, and every plain TRL
    config) when there are several runs to compare."""
    setting = getattr(getattr(slot.trainer, "args", None), STOP_DIVERGED_ATTR, None)
    return runs > 1 if setting is None else bool(setting)


def check_finite(slot: RunSlot, step: int, *, runs: int) -> None:
    """Raise :class:`RunDiverged` if ``slot``'s run has diverged (see :func:`divergence`),
    naming the setting at fault when one is not a finite number, else its learning rate.
    Where the run trains on (:func:`stops_diverged`), a ``RuntimeWarning`` says so instead,
    once: the reason is kept as the run trainer's ``rf_diverged``, and not looked for again
    (its weights stay non-finite)."""
    trainer = slot.trainer
    if trainer is not None and trainer.__dict__.get("rf_diverged"):
        return  # warned: it trains on as TRL's trainer would
    reason = divergence(slot, step)
    if reason is None:
        return
    setting = bad_setting(slot)
    cause = (f"its setting {setting}: give it a finite number" if setting is not None else
             "its learning rate (or another setting) is likely too large")
    if stops_diverged(slot, runs):
        raise RunDiverged(f"{slot.name} diverged: {reason}; {cause}")
    if trainer is not None:
        trainer.__dict__["rf_diverged"] = reason
    warnings.warn(f"{slot.name} diverged: {reason}; {cause}. It trains on, as its TRL trainer "
                  "alone would (stop_diverged=True in the RF config stops it instead).",
                  RuntimeWarning, stacklevel=2)
