"""Optuna, an optional dependency: imported only when an Optuna search or pruner is used.

``pip install optuna`` (from a clone: ``pip install -e '.[optuna]'``) installs it. Optuna logs
each study it creates and each trial it is told at INFO level; :func:`quiet_optuna` keeps those
lines out of the experiment's progress display while our own calls run (the tags, ``status``
and the report say it instead).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from types import ModuleType

__all__ = ["OptunaMissing", "quiet_optuna", "require_optuna"]


class OptunaMissing(ImportError):
    """Optuna is not installed; the message names the extra that installs it."""


def require_optuna(what: str) -> ModuleType:
    """The ``optuna`` module, or :class:`OptunaMissing` saying how to install it.

    ``what``: the class that needs it (``OptunaSearch``, ``OptunaPruner``), for the message."""
    try:
        import optuna
    except ImportError as err:
        raise OptunaMissing(
            f"{what} needs Optuna, which is not installed. Install it: "
            "pip install optuna (from a clone of trl-rapidfire: pip install -e '.[optuna]')."
        ) from err
    return optuna


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines (a study created, a trial finished) silenced for the body."""
    logger = logging.getLogger("optuna")
    before = logger.level
    if before >= logging.WARNING:
        # setLevel clears every logger's cache (transformers has hundreds): at each pruner
        # question that was a millisecond.
        yield
        return
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(before)
