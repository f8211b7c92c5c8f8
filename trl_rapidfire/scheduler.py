"""Which run trains next. Never how to train it.

The scheduler sees each run as a :class:`RunView` (status and progress) and picks the next
(run, chunk) to train. The rule: least progress first, measured as the fraction of its own
chunks a run has done, so runs of different lengths advance together and every run shows a
learning curve after its first chunk. Ties go to the run whose state is already resident (no
swap needed), then to the run declared first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .runs import RunStatus

__all__ = ["RunView", "pick_next"]


@dataclass(frozen=True)
class RunView:
    """What the scheduler needs to know about a run.

    Attributes:
        name: the run's name.
        index: declaration order (the last tie-break).
        status: only ``pending`` and ``running`` runs are picked.
        chunks_done: chunks trained so far.
        chunks_total: chunks in the run's plan.
    """

    name: str
    index: int
    status: RunStatus
    chunks_done: int
    chunks_total: int

    @property
    def progress(self) -> Fraction:
        # Exact fractions: 1/3 and 2/6 must tie.
        return Fraction(self.chunks_done, max(self.chunks_total, 1))


def pick_next(runs: Sequence[RunView], resident: str | None = None) -> str | None:
    """The name of the run to train next, or ``None`` when no run can be scheduled.

    Args:
        runs: every run of the experiment.
        resident: the run whose state is on the device now, if any.
    """
    candidates = [
        r for r in runs if r.status.schedulable and r.chunks_done < r.chunks_total
    ]
    if not candidates:
        return None
    best = min(candidates, key=lambda r: (r.progress, r.name != resident, r.index))
    return best.name
