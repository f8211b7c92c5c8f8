"""The training stack's private names, touched here and nowhere else (but for accelerate's
singletons, in the wall :mod:`.accelerate_state`; Optuna's, in :mod:`.foreign_optuna`; MLflow's
entities', in :mod:`.foreign_mlflow`, and its engine cache, in
:mod:`trl_rapidfire.tracking.mlflow_store`): each is a place a new version of that library can
break, so each is named, says why, and has a public fallback.

* PEFT: a tuner layer's ``_active_adapter`` and a wrapper's ``_adapters``. Switching runs sets
  the active adapter on layer lists found once instead of ``set_adapter``'s walk over every
  module (9 ms against well under 1 ms a switch at a 135M model's shape with 8 adapters). Used
  only with a PEFT whose minor version this fast path was checked against
  (:data:`PEFT_CHECKED`, the test suite's); with another, the model pool uses PEFT's own
  ``set_adapter`` (slower switches, the same weights) and says so once.
* torch: ``ModuleDict._modules``, the dict a ``ModuleDict`` keeps its entries in: a detached
  adapter's very modules are taken out of it and put back without ``Module.__delattr__``'s and
  ``add_module``'s checks (each a lookup through three dicts; together half of a switch on the
  tiny model). Stable since torch 1.0, and what ``ModuleDict.__setitem__`` and ``__delitem__``
  end with.
* datasets: ``Dataset._fingerprint``, what identifies a dataset between two launches of a
  script (datasets has no public name for it); without one, the dataset's length.
* transformers' Trainer: ``_tr_loss`` (the loss summed since the last log), ``_total_loss_scalar``
  (the logged sums, ``train_loss``'s numerator) and ``_globalstep_last_logged`` (the step the
  next logged ``loss`` averages from), which ``_inner_training_loop`` sets afresh at the start of
  every ``train()``; TRL's trainers: ``_metrics`` (each metric's values since the last log,
  averaged when it logs) and ``_total_train_tokens`` (SFT's and DPO's ``num_tokens``), set
  afresh by each new trainer. None of them is in the Trainer's checkpoint, so a run continued
  from its boundary checkpoint would log other values than the run trained through
  (:mod:`trl_rapidfire.trainers.log_state` saves and restores them). Each is read and set only
  where the trainer has it: without one, that value logs as the Trainer's own resume logs it
  (counted from the resume), which docs/workers-and-resume.md names.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import warnings
from collections.abc import Collection
from typing import Any

import torch

__all__ = [
    "PEFT_CHECKED",
    "dataset_fingerprint",
    "log_carry",
    "peft_fast_switch",
    "entries_of",
    "restore_log_carry",
    "set_layer_active_adapter",
    "total_loss_scalar",
    "wrapper_adapters",
]

# The PEFT minor versions (low, high) whose adapter bookkeeping the fast switch was checked
# against: the test suite's (constraints.txt). A new PEFT minor is added here once the tests
# (tests/runtime/test_models.py) pass with it.
PEFT_CHECKED = ((0, 21), (0, 21))


def _minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


@functools.cache
def peft_fast_switch(version: str | None = None) -> bool:
    """Whether the installed PEFT (or ``version``) is one the fast adapter switch was checked
    against; if not, warns once and the model pool uses PEFT's public ``set_adapter``."""
    version = version or importlib.metadata.version("peft")
    minor = _minor(version)
    low, high = PEFT_CHECKED
    if minor is not None and low <= minor <= high:
        return True
    warnings.warn(
        f"trl-rapidfire: PEFT {version} is not a version its fast adapter switch was checked "
        f"against ({low[0]}.{low[1]} to {high[0]}.{high[1]}); switching runs uses PEFT's own "
        "set_adapter instead (slower switches, the same training).", RuntimeWarning,
        stacklevel=2)
    return False


def set_layer_active_adapter(layer: Any, name: str) -> None:
    """What PEFT's ``BaseTunerLayer.set_adapter(name)`` sets last, once the adapters'
    trainability is already right (the caller toggled it)."""
    # Straight into the instance dict: a list is never a parameter, buffer or submodule, so
    # Module.__setattr__'s checks (a tenth of a switch's calls) would end there too.
    layer.__dict__["_active_adapter"] = [name]


def wrapper_adapters(module: Any) -> Collection[str]:
    """The adapters a PEFT ``AuxiliaryTrainingWrapper`` (``modules_to_save``, trainable
    tokens) holds copies for."""
    return getattr(module, "_adapters", ())


def wrapper_copies(module: Any) -> tuple[torch.nn.ModuleDict, set[str]] | None:
    """For a PEFT ``ModulesToSaveWrapper`` (a reward model's score head, trained per adapter):
    the dict of its per-adapter copies and the set of adapters it knows, which a detached
    adapter's copy leaves together; ``None`` for any other wrapper (trainable tokens)."""
    from peft.utils.other import ModulesToSaveWrapper

    if not isinstance(module, ModulesToSaveWrapper):
        return None
    adapters = getattr(module, "_adapters", None)
    copies = getattr(module, "modules_to_save", None)
    if not isinstance(adapters, set) or not isinstance(copies, torch.nn.ModuleDict):
        return None  # another PEFT's layout: the adapter stays attached
    return copies, adapters


def entries_of(container: Any) -> Any:
    """The mutable mapping that holds ``container``'s per-adapter entries: a ``ModuleDict``'s
    ``_modules``, a plain dict itself; ``container`` itself for anything else (a
    ``ParameterDict``, whose entries live in its parameters)."""
    if type(container) is torch.nn.ModuleDict:
        modules = container.__dict__.get("_modules")
        if type(modules) is dict:
            return modules
    return container


def dataset_fingerprint(data: Any) -> Any:
    """What identifies ``data`` between two launches of a script: a ``datasets.Dataset``'s
    fingerprint (the hash of how it was made), else its length, else its type's name."""
    fingerprint = getattr(data, "_fingerprint", None)
    if fingerprint:
        return fingerprint
    return len(data) if hasattr(data, "__len__") else type(data).__name__


# The Trainer's own logging state between steps of one train() (see the module docstring).
_TRAINER_SCALARS = ("_total_loss_scalar", "_globalstep_last_logged")


def log_carry(trainer: Any) -> dict[str, Any]:
    """What ``trainer``'s next logs carry over from the steps already trained, as plain values
    (exact: a float32 or float64 is a Python float exactly): the loss summed since the last
    log, the logged sums, the step of the last log, TRL's metric values since the last log and
    its token count. A name this transformers or TRL lacks is left out."""
    carry: dict[str, Any] = {}
    tr_loss = getattr(trainer, "_tr_loss", None)
    if isinstance(tr_loss, torch.Tensor) and tr_loss.numel() == 1:
        carry["tr_loss"] = tr_loss.item()  # one device sync, at a boundary
    for name in _TRAINER_SCALARS:
        value = getattr(trainer, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            carry[name.lstrip("_")] = value
    metrics = getattr(trainer, "_metrics", None)
    if isinstance(metrics, dict):
        carry["metrics"] = {
            mode: {key: plain for key, values in by_key.items()
                   if (plain := _numbers(values)) is not None}
            for mode, by_key in metrics.items() if isinstance(by_key, dict)}
    tokens = getattr(trainer, "_total_train_tokens", None)
    if isinstance(tokens, (int, float)) and not isinstance(tokens, bool):
        carry["total_train_tokens"] = tokens
    return carry


def _numbers(values: Any) -> list[float | int] | None:
    """``values`` (a metric's list) as plain numbers, exactly (a one-element tensor by its
    ``item()``); ``None`` if one is something else (that metric is then not carried over)."""
    if not isinstance(values, (list, tuple)):
        return None
    plain: list[float | int] = []
    for value in values:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        plain.append(value)
    return plain


def restore_log_carry(trainer: Any, carry: dict[str, Any]) -> None:
    """Put :func:`log_carry`'s values back into ``trainer``, once its ``train()`` has set its
    own logging state up (``on_train_begin``) and before its first step. Only names the
    trainer has are set, in place where they are containers (the training loop and TRL hold
    no other reference, but a defaultdict must stay one)."""
    tr_loss = getattr(trainer, "_tr_loss", None)
    if "tr_loss" in carry and isinstance(tr_loss, torch.Tensor) and tr_loss.numel() == 1:
        with torch.no_grad():
            tr_loss.fill_(carry["tr_loss"])
    for name in _TRAINER_SCALARS:
        if name.lstrip("_") in carry and hasattr(trainer, name):
            setattr(trainer, name, carry[name.lstrip("_")])
    metrics = getattr(trainer, "_metrics", None)
    if isinstance(metrics, dict):
        for mode, by_key in carry.get("metrics", {}).items():
            if isinstance(metrics.get(mode), dict):
                metrics[mode].clear()
                metrics[mode].update({key: list(values) for key, values in by_key.items()})
    if "total_train_tokens" in carry and hasattr(trainer, "_total_train_tokens"):
        trainer._total_train_tokens = carry["total_train_tokens"]


def total_loss_scalar(trainer: Any) -> float | None:
    """The Trainer's sum of the losses logged (and, once training ends, of the rest): what its
    ``train_loss`` divides; ``None`` where this transformers does not keep it."""
    value = getattr(trainer, "_total_loss_scalar", None)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
