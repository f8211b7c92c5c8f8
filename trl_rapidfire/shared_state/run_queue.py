"""One worker's queue of the runs it may claim, in the scheduler's order, kept up to date.

:func:`~trl_rapidfire.shared_state.store.choose` applies the scheduler's rule
(:func:`~trl_rapidfire.shared_state.scheduler.pick_next`) by looking at every run: at 512 runs that
pass is
a large part of what a one-step chunk costs besides its step. A :class:`RunQueue` gives the
same answer from two heaps (every claimable run, and those whose live state is on this worker)
updated only for the runs that changed since the last claim, as the shared state's change feed
reports them (:meth:`~trl_rapidfire.shared_state.state_file.FileStore.take_changed_runs`): a claim
costs
O(changes x log N) instead of O(N).

Entries are never removed from the middle of a heap: a run's current key is kept in a dict, and
an entry that no longer matches it is dropped when it reaches the top (lazy deletion).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable

from .runs import SCHEDULABLE
from .scheduler import Order, rank
from .store import ExperimentState, choose

__all__ = ["RunQueue"]

# The rank is the scheduler's (a float, not a Fraction: five times cheaper to make).
_Key = tuple[float, int, bool]  # (rank, declaration index, owned by this worker)
_Entry = tuple[float, int, str]  # (rank, declaration index, run)


class RunQueue:
    """The runs ``worker`` may claim, ordered as :func:`~trl_rapidfire.shared_state.store.choose`
    orders
    them: by the scheduler's rank in ``order`` (least progress first by default); among equals
    the resident run, then runs this worker owns, then declaration order.

    Args:
        worker: the worker whose queue it is (only it may claim a run whose volatile chunks
            it holds).
        order: the scheduler's order (:class:`~trl_rapidfire.shared_state.scheduler.Order`).
    """

    def __init__(self, worker: str, order: Order = Order.EVEN) -> None:
        self.worker = worker
        self.order = order
        self._keys: dict[str, _Key] = {}  # claimable run -> its current key
        self._index: dict[str, int] = {}  # run -> its place in the declaration order
        self._all: list[_Entry] = []
        self._owned: list[_Entry] = []
        self._state: ExperimentState | None = None  # the state object the queue is of

    def update(self, state: ExperimentState, changed: Iterable[str] | None) -> None:
        """Take in the runs whose record, plan, claim or owner changed (``None``: any may have,
        or ``state`` is another object than last time: the queue is built anew)."""
        if changed is None or state is not self._state:
            self._rebuild(state)
            return
        for name in changed:
            self._refresh(state, name)
        # Stale entries pile up only as fast as runs change; rebuilt once they outnumber the
        # runs (amortised O(1) per change).
        if len(self._all) + len(self._owned) > 4 * len(self._keys) + 64:
            self._rebuild(state)

    def pick(self, state: ExperimentState, worker: str,
             finishing: Collection[str] = frozenset()) -> str | None:
        """The run the scheduler gives ``worker`` next: the answer of
        :func:`~trl_rapidfire.shared_state.store.choose`, for a ``state`` the queue is up to date
        with."""
        if worker != self.worker or state is not self._state:
            return choose(state, worker, finishing, self.order)
        if any(name in self._keys for name in finishing):
            # A run being recorded that is also claimable counts one chunk further: rare
            # enough (its claim was lost) to answer by the full pass.
            return choose(state, worker, finishing, self.order)
        resident = state.last_run.get(worker)
        candidates = []
        for heap, owned_only in ((self._all, False), (self._owned, True)):
            top = self._top(heap, owned_only)
            if top is not None:
                candidates.append(self._ranked(top[2], resident))
        if resident is not None and resident in self._keys:
            candidates.append(self._ranked(resident, resident))
        for name in finishing:
            # Still held here while its last chunk is recorded: counted as if it were (as
            # choose counts it).
            key = self._key_of(state, name, finishing=True)
            if key is not None:
                candidates.append((key[0], self.order.resident_first and name != resident,
                                   not key[2], key[1], name))
        return min(candidates)[-1] if candidates else None

    # ------------------------------------------------------------------ internals

    def _ranked(self, name: str, resident: str | None) -> tuple[float, bool, bool, int, str]:
        ranked, index, owned = self._keys[name]
        return ranked, self.order.resident_first and name != resident, not owned, index, name

    def _top(self, heap: list[_Entry], owned_only: bool) -> _Entry | None:
        while heap:
            ranked, index, name = heap[0]
            key = self._keys.get(name)
            if key is not None and key[0] == ranked and key[1] == index \
                    and (key[2] or not owned_only):
                return heap[0]
            heapq.heappop(heap)
        return None

    def _rebuild(self, state: ExperimentState) -> None:
        self._state = state
        self._index = {name: i for i, name in enumerate(state.order)}
        self._keys, self._all, self._owned = {}, [], []
        for name in state.runs:
            self._refresh(state, name)

    def _place(self, state: ExperimentState, name: str) -> int:
        index = self._index.get(name)
        if index is None:  # added since: the order only grows at its end
            for i in range(len(self._index), len(state.order)):
                self._index[state.order[i]] = i
            index = self._index.get(name, len(state.order))
        return index

    def _refresh(self, state: ExperimentState, name: str) -> None:
        """Recompute ``name``'s key from the state; push it if it is new."""
        key = self._key_of(state, name)
        if key is None:
            self._keys.pop(name, None)
            return
        if self._keys.get(name) == key:
            return
        self._keys[name] = key
        entry = (key[0], key[1], name)
        heapq.heappush(self._all, entry)
        if key[2]:
            heapq.heappush(self._owned, entry)

    def _key_of(self, state: ExperimentState, name: str, *, finishing: bool = False
                ) -> _Key | None:
        """``name``'s key if ``worker`` may claim it now, else ``None`` (the conditions of
        :func:`~trl_rapidfire.shared_state.store.choose`). ``finishing``: a run this worker still
        holds while
        its last chunk is recorded, counted one chunk further, its claim no bar."""
        record = state.runs.get(name)
        if record is None or record.status not in SCHEDULABLE \
                or (name in state.claims and not finishing):
            return None
        total = state.chunks_total.get(name, 0)
        done = record.chunks_done + finishing
        if done >= total:
            return None
        owner = state.owner.get(name, self.worker)
        if owner != self.worker and record.volatile:
            return None  # its volatile chunks live in their owner only
        return (rank(done, total, self.order), self._place(state, name),
                state.owner.get(name) == self.worker)
