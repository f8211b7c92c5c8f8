"""One rung's runs, kept sorted by their metric as runs change, so that a policy's decision at
a rung costs O(log N) instead of a pass over every run's history.

A :class:`Rung` belongs to a :class:`~.base.Context` and is told of every run whose history
the context replaces (:meth:`Rung.replace`): an experiment's context changes by the few runs
that moved since the policy last looked, and so does each of its rungs. What it answers is what
a pass over the histories would (the tests compare both on random experiments).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort

from ...shared_state.runs import RunStatus
from .history import RunHistory, metric_at

__all__ = ["Rung"]


class Rung:
    """The runs of an experiment at ``chunks`` chunks, judged by ``metric`` (``mode``: ``min``
    or ``max``).

    Three sets are kept, each as SuccessiveHalving reads it:

    * *arrived*: runs not deleted that have ``chunks`` chunks done and a value there (NaN left
      out), as (key, -order, name) sorted: the key is the value, negated for ``max`` (smaller
      is better), and among equal values the later run comes first (so that the ranking
      reversed is worst first with ties in the runs' order, as PopulationBased ranks);
    * *to come*: runs in the rotation with fewer chunks whose plan reaches ``chunks``;
    * *waiting*: arrived runs that sit at the rung (exactly ``chunks`` done), are in the
      rotation, are not training their next chunk elsewhere and have chunks left, as
      (key, order, name) sorted: the ones a decision here can still stop.
    """

    def __init__(self, metric: str, chunks: int, mode: str) -> None:
        self.metric, self.chunks, self.sign = metric, chunks, (1.0 if mode == "min" else -1.0)
        self._arrived: list[tuple[float, int, str]] = []
        self._arrived_entry: dict[str, tuple[float, int, str]] = {}
        self._to_come: set[str] = set()
        self._waiting: list[tuple[float, int, str]] = []
        self._waiting_entry: dict[str, tuple[float, int, str]] = {}

    # ------------------------------------------------------------------ kept up to date

    def replace(self, old: RunHistory | None, new: RunHistory, order: int) -> None:
        """``new`` is now the run's history (``old``: what it was, ``None`` for a new run);
        ``order``: the run's place in the experiment (ties are broken by it)."""
        name = new.name
        entry = self._arrived_entry.get(name)
        key = entry[0] if entry is not None else None
        # A run's log up to a chunk never changes once the run is past it (training only
        # appends), so its value here is looked up again only when it arrives or went back.
        if key is None or old is None or new.chunks_done < old.chunks_done \
                or new.chunks_done < self.chunks:
            key = self._key(new)
        if key is None or new.status == RunStatus.DELETED:
            self._forget(name)
            if (key is None and new.status.schedulable
                    and new.chunks_done < self.chunks <= new.chunks_total):
                self._to_come.add(name)
            return
        self._to_come.discard(name)
        # Most replacements are a run moving on past this rung: its place among the arrived
        # runs stays, only whether it waits here changes; the sorted lists are touched only
        # where something moved in them.
        if entry is None or entry[0] != key:
            if entry is not None:
                del self._arrived[bisect_left(self._arrived, entry)]
            self._arrived_entry[name] = entry = (key, -order, name)
            insort(self._arrived, entry)
        waits = (new.chunks_done == self.chunks < new.chunks_total and new.status.schedulable
                 and not new.training)
        waiting = self._waiting_entry.get(name)
        if waiting is not None and (not waits or waiting[0] != key):
            del self._waiting[bisect_left(self._waiting, waiting)]
            del self._waiting_entry[name]
            waiting = None
        if waits and waiting is None:
            self._waiting_entry[name] = waiting = (key, order, name)
            insort(self._waiting, waiting)

    def _key(self, history: RunHistory) -> float | None:
        if history.chunks_done < self.chunks:
            return None
        value = metric_at(history, self.metric, self.chunks)
        return None if value is None or math.isnan(value) else self.sign * value

    def _forget(self, name: str) -> None:
        entry = self._arrived_entry.pop(name, None)
        if entry is not None:
            del self._arrived[bisect_left(self._arrived, entry)]
        waiting = self._waiting_entry.pop(name, None)
        if waiting is not None:
            del self._waiting[bisect_left(self._waiting, waiting)]
        self._to_come.discard(name)

    # ------------------------------------------------------------------ what it answers

    @property
    def arrived(self) -> int:
        """Runs with a value here."""
        return len(self._arrived)

    @property
    def to_come(self) -> int:
        """Runs in the rotation that can still arrive here."""
        return len(self._to_come)

    def better_than(self, value: float) -> int:
        """How many arrived runs are strictly better than ``value``."""
        return bisect_left(self._arrived, (self.sign * value, -math.inf))

    def value_of(self, name: str) -> float | None:
        """The run's value here, if it arrived with one."""
        entry = self._arrived_entry.get(name)
        return None if entry is None else self.sign * entry[0]

    def value_at(self, rank: int) -> float:
        """The value of the arrived run ranked ``rank`` (0: the best)."""
        return self.sign * self._arrived[rank][0]

    def name_at(self, rank: int) -> str:
        """The arrived run ranked ``rank`` (0: the best; among equal values, later runs
        first)."""
        return self._arrived[rank][2]

    def best(self, count: int) -> list[str]:
        """The ``count`` best arrived runs, best first (among equal values, later runs
        first)."""
        return [name for _, _, name in self._arrived[:count]]

    def beaten_waiting(self, keep: int) -> list[str]:
        """The waiting runs with at least ``keep`` arrived runs strictly better, in the
        experiment's order: the ones the rule ``keep the best keep`` stops now."""
        if keep < 1 or len(self._arrived) < keep:
            return []
        threshold = self._arrived[keep - 1][0]  # the keep-th best: stopped is what is worse
        first = bisect_right(self._waiting, threshold, key=lambda entry: entry[0])
        return [name for _, _, name in sorted(self._waiting[first:], key=lambda e: e[1])]
