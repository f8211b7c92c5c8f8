"""Optuna's private names, read and set here and nowhere else (the wall for Optuna; the other
libraries' are in :mod:`.foreign_internals` and :mod:`.foreign_mlflow`). Each is a place a new
Optuna can break, so each is named, says why, and falls back to the public behaviour when the
name is gone; ``tests/runtime/test_foreign_wall.py`` fails loudly on an Optuna that lacks one.

Checked against the Optuna versions in :data:`OPTUNA_CHECKED` (the test suite's, constraints.txt;
the names are the same since Optuna 2.x):

* ``SuccessiveHalvingPruner._min_resource``, ``._reduction_factor``,
  ``._min_early_stopping_rate`` and ``HyperbandPruner._min_resource``, ``._max_resource``,
  ``._reduction_factor``: the steps at which these pruners record values (their rungs), which
  Optuna keeps only in these attributes. The pruner policy evaluates only at those steps and
  finds two rungs passed within one chunk from them.
* The same resources, when ``"auto"``: Optuna sets them once a trial has completed, which in
  interleaved training comes only at the very end; :func:`with_resources` sets them on a *copy*
  of the user's pruner (the user's object is never changed).
* ``GridSampler._search_space``: the grid a ``GridSampler`` was given, which the search checks
  against its own space before the first proposal (Optuna has no public reader).

Imports nothing of the training stack (the client may import this layer).
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["OPTUNA_CHECKED", "OPTUNA_NAMES", "grid_search_space", "halving_rungs",
           "with_resources"]

# The Optuna versions whose private names below were read in Optuna's source and tested (the
# test suite's, constraints.txt). A new Optuna is added once tests/runtime/test_foreign_wall.py
# passes with it.
OPTUNA_CHECKED = ("5.1.0",)

# Every private name this module touches, by the class that holds it (the wall's test asserts
# each exists on the installed Optuna's objects).
OPTUNA_NAMES: dict[str, tuple[str, ...]] = {
    "pruners.SuccessiveHalvingPruner": ("_min_resource", "_reduction_factor",
                                        "_min_early_stopping_rate"),
    "pruners.HyperbandPruner": ("_min_resource", "_max_resource", "_reduction_factor"),
    "samplers.GridSampler": ("_search_space",),
}


def _kind(pruner: Any) -> str | None:
    """``"halving"`` or ``"hyperband"`` for those exact Optuna types (a subclass may keep its
    rungs elsewhere), else ``None``."""
    try:
        import optuna
    except ImportError:  # without Optuna no object is one of its pruners
        return None
    kind = type(pruner)
    if kind is optuna.pruners.SuccessiveHalvingPruner:
        return "halving"
    if kind is optuna.pruners.HyperbandPruner:
        return "hyperband"
    return None


def halving_rungs(pruner: Any) -> tuple[Any, Any] | None:
    """(first rung step, reduction factor) of a ``SuccessiveHalvingPruner`` (its
    ``min_resource * reduction_factor**min_early_stopping_rate``) or a ``HyperbandPruner``
    (its ``min_resource``: bracket b starts at ``min_resource * factor**b``, together every
    power); ``None`` for any other pruner. The first rung is ``None`` while the resource is
    still ``"auto"`` and unset. Values are as Optuna holds them; the caller checks their type.
    Checked against :data:`OPTUNA_CHECKED`; a name gone in another Optuna reads as ``None``
    (the caller then evaluates and asks at every chunk end, the public behaviour)."""
    kind = _kind(pruner)
    if kind is None:
        return None
    least = getattr(pruner, "_min_resource", None)
    factor = getattr(pruner, "_reduction_factor", None)
    rate = getattr(pruner, "_min_early_stopping_rate", 0) if kind == "halving" else 0
    if isinstance(least, int) and isinstance(factor, int) and isinstance(rate, int):
        least *= factor ** rate
    return least, factor


def with_resources(pruner: Any, last_step: int) -> Any:
    """A deep copy of ``pruner`` with its ``"auto"`` resources set as Optuna sets them once a
    trial has completed, from ``last_step`` (the runs' planned last step): a
    ``SuccessiveHalvingPruner``'s ``min_resource`` (Optuna's ``_estimate_min_resource``: 1% of
    the last step) and a ``HyperbandPruner``'s ``max_resource`` (its
    ``_try_initialization``: the last step + 1). ``pruner`` itself is never changed: it is the
    user's object, which a script may reuse or inspect. Checked against
    :data:`OPTUNA_CHECKED`."""
    copied = copy.deepcopy(pruner)
    kind = _kind(copied)
    if last_step <= 0 or kind is None:
        return copied
    if kind == "halving" and getattr(copied, "_min_resource", 0) is None:
        copied._min_resource = max(last_step // 100, 1)
    if kind == "hyperband" and getattr(copied, "_max_resource", None) == "auto":
        copied._max_resource = last_step + 1
    return copied


def grid_search_space(sampler: Any) -> dict[str, list[Any]]:
    """The grid a ``GridSampler`` was given (parameter name -> values, as given; Optuna keeps
    it only in ``_search_space``). Checked against :data:`OPTUNA_CHECKED`; empty where another
    Optuna keeps it elsewhere (the search then names the grid's parameters as none, and
    refuses it rather than guess)."""
    return {str(k): list(v) for k, v in getattr(sampler, "_search_space", {}).items()}
