"""Which run trains next. Never how to train it.

The scheduler sees each run as a :class:`RunView` (status and progress) and picks the next
(run, chunk) to train, by one of two orders (:class:`Order`):

* ``EVEN`` (the default): least progress first, measured as the fraction of its own chunks a
  run has done, so runs of different lengths advance together and every run shows a learning
  curve after its first chunk.
* ``PROMOTE``: a run that has not trained yet first (its first chunk: a point on its curve,
  and what an early-stopping policy first judges it by), then the most advanced run. The
  leader trains on while the others wait, so a run that survives its policy's checks
  finishes (and its result reaches an adaptive search) as soon as it alone could: successive
  halving's "promotions first". An ``OptunaSearch`` option
  (``order="promote"``); see docs/adaptive-search.md for what it gains and loses.

Ties go to the run whose state is already resident (no swap needed; ``EVEN`` only: under
``PROMOTE`` the leader trains on without ties, and the runs waiting after their first chunk
are served in the order they were declared or proposed, not the newest first), then to runs
this worker holds, then to the run declared first.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from enum import StrEnum
from fractions import Fraction
from typing import NamedTuple

from .runs import SCHEDULABLE, RunStatus

__all__ = ["Order", "RunView", "pick_next", "rank"]


class Order(StrEnum):
    """In what order runs take turns (see the module's docstring)."""

    EVEN = "even"
    PROMOTE = "promote"

    @property
    def resident_first(self) -> bool:
        """Whether ties go to the resident run first (``EVEN``); under ``PROMOTE`` the
        waiting runs are served oldest first instead (see the module's docstring)."""
        return self is Order.EVEN


def rank(done: int, total: int, order: Order) -> float:
    """A run's place in ``order`` with ``done`` of its ``total`` chunks trained: lower goes
    first. A float: division is correctly rounded, so equal ratios (1/3, 2/6) rank equal, and
    two different ratios of chunk counts below 2**20 differ by at least 2**-40, far above a
    double's resolution (``1 - x`` keeps that: exact for x >= 1/2, and rounding near 1 moves
    it by 2**-53 at most)."""
    progress = done / max(total, 1)
    if order is Order.EVEN:
        return progress
    return -1.0 if done == 0 else 1.0 - progress


class RunView(NamedTuple):
    """What the scheduler needs to know about a run.

    Attributes:
        name: the run's name.
        index: declaration order (the last tie-break).
        status: only ``pending`` and ``running`` runs are picked.
        chunks_done: chunks trained so far.
        chunks_total: chunks in the run's plan.
    """

    name: str
    # A field named like tuple.index (the declaration order): mypy reads it as an override.
    index: int  # type: ignore[assignment]
    status: RunStatus
    chunks_done: int
    chunks_total: int

    @property
    def progress(self) -> Fraction:
        # Exact fractions: 1/3 and 2/6 must tie.
        return Fraction(self.chunks_done, max(self.chunks_total, 1))


def pick_next(
    runs: Iterable[RunView | tuple], resident: str | None = None,
    local: Container[str] = frozenset(), order: Order = Order.EVEN,
) -> str | None:
    """The name of the run to train next, or ``None`` when no run can be scheduled.

    Args:
        runs: every run of the experiment, as :class:`RunView` or plain
            ``(name, index, status, chunks_done, chunks_total)`` tuples.
        resident: the run whose state is on the device now, if any.
        local: runs whose live state is on this worker (with several workers: the others
            would have to restore theirs from disk). Preferred after ``resident``.
        order: which runs go first (:class:`Order`).
    """
    if order is not Order.EVEN:
        return _pick_ranked(runs, resident, local, order)
    # One pass, tuples unpacked, progress compared by integer cross-multiplication: exact like
    # Fractions and cheap enough for a decision over 1,000 runs well under a millisecond.
    best = None
    best_done = best_total = 0
    best_key: tuple[bool, bool, int] = (True, True, 0)
    for name, index, status, done, total in runs:
        if status not in SCHEDULABLE or done >= total:
            continue
        total = max(total, 1)
        if best is not None:
            lhs, rhs = done * best_total, best_done * total
            if lhs > rhs:
                continue
            key = (name != resident, name not in local, index)
            if lhs == rhs and key >= best_key:
                continue
        else:
            key = (name != resident, name not in local, index)
        best, best_done, best_total, best_key = name, done, total, key
    return best


def _pick_ranked(runs: Iterable[RunView | tuple], resident: str | None,
                 local: Container[str], order: Order) -> str | None:
    """:func:`pick_next` by :func:`rank` (what a worker's claim queue keys its heaps by)."""
    best, best_key = None, None
    for name, index, status, done, total in runs:
        if status not in SCHEDULABLE or done >= total:
            continue
        key = (rank(done, total, order), order.resident_first and name != resident,
               name not in local, index)
        if best_key is None or key < best_key:
            best, best_key = name, key
    return best
