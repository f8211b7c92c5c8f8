"""Other libraries' private names, touched here and nowhere else (but for accelerate's
singletons, in the wall :mod:`.accelerate_state`, and MLflow's engine cache, in
:mod:`trl_rapidfire.tracking.mlflow_store`): each is a place a new version of that library can
break, so each is named, says why, and has a public fallback.

* PEFT: a tuner layer's ``_active_adapter`` and a wrapper's ``_adapters``. Switching runs sets
  the active adapter on layer lists found once instead of ``set_adapter``'s walk over every
  module (9 ms against well under 1 ms a switch at a 135M model's shape with 8 adapters). Used
  only with a PEFT whose minor version this fast path was checked against
  (:data:`PEFT_CHECKED`, the test suite's); with another, the model pool uses PEFT's own
  ``set_adapter`` (slower switches, the same weights) and says so once.
* torch: ``ModuleDict._modules``, to put a detached adapter's very modules back without
  ``add_module``'s checks of a new name (a third of a switch on the tiny model); stable since
  torch 1.0, and what ``ModuleDict.__setitem__`` ends with.
* datasets: ``Dataset._fingerprint``, what identifies a dataset between two launches of a
  script (datasets has no public name for it); without one, the dataset's length.
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
    "peft_fast_switch",
    "put_module_back",
    "set_layer_active_adapter",
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
    layer._active_adapter = [name]


def wrapper_adapters(module: Any) -> Collection[str]:
    """The adapters a PEFT ``AuxiliaryTrainingWrapper`` (``modules_to_save``, trainable
    tokens) holds copies for."""
    return getattr(module, "_adapters", ())


def put_module_back(container: torch.nn.ModuleDict, key: str, module: torch.nn.Module) -> None:
    """Put ``module``, taken out of ``container`` under ``key``, back where it was."""
    container._modules[key] = module


def dataset_fingerprint(data: Any) -> Any:
    """What identifies ``data`` between two launches of a script: a ``datasets.Dataset``'s
    fingerprint (the hash of how it was made), else its length, else its type's name."""
    fingerprint = getattr(data, "_fingerprint", None)
    if fingerprint:
        return fingerprint
    return len(data) if hasattr(data, "__len__") else type(data).__name__
