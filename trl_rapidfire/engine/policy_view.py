"""What the policy sees: one :class:`~trl_rapidfire.control.policies.Context` for the whole
experiment, brought up to date at each boundary with the runs that moved since the last look.

Rebuilding every run's history at every chunk end made a policy's boundary cost O(N), and an
experiment's O(N^2) in policy work alone (3.9 ms a boundary at 128 runs). Here only the runs
the coordinator says moved (a record adopted, a chunk trained here, a claim taken or given up
elsewhere) get a new history; the context's indexes follow them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ..control.policies import Context, RunHistory
from .records import RunSlot, history_of

__all__ = ["MovedRuns", "PolicyView"]


class MovedRuns:
    """The runs whose view in this worker moved (a record adopted, a chunk trained here, a
    claim taken or given up elsewhere) since they were last taken; the coordinator notes
    them, the policy's view takes them."""

    def __init__(self) -> None:
        self._names: set[str] | None = None  # None: any may have (nothing taken yet)

    def note(self, *names: str) -> None:
        if self._names is not None:
            self._names.update(names)

    def take(self) -> set[str] | None:
        """The runs noted since the last call (``None``: any may have moved)."""
        names, self._names = self._names, set()
        return names


class PolicyView:
    """The experiment as the policy sees it, kept up to date by the runs that moved.

    Args:
        slots: the engine's runs (shared, not copied).
        moved: takes the names of the runs whose view moved since the last call (``None``:
            any may have; the first call, and whenever the caller lost track).
        pending: (run, chunk number) of each chunk trained here and not recorded yet: such a
            chunk counts as done for the policy (its decision must come before the next
            claim).
        elsewhere: the runs another worker is training now.
        clock: the experiment's training wall seconds.
    """

    def __init__(self, *, slots: dict[str, RunSlot], moved: Callable[[], set[str] | None],
                 pending: Callable[[], Iterator[tuple[str, int]]],
                 elsewhere: Callable[[], set[str]], clock: Callable[[], float]) -> None:
        self._slots = slots
        self._moved = moved
        self._pending = pending
        self._elsewhere = elsewhere
        self._clock = clock
        self._context: Context | None = None
        self._done: dict[str, int] = {}  # chunks done as of each run's history here
        self._asked: dict[str, int] = {}  # chunks done when the policy was last asked
        self._unasked: set[str] = set()  # runs updated since the policy was last asked
        self.histories_built = 0  # how many histories were made (tests count them)

    def refresh(self) -> Context:
        """The context as of now."""
        moved = self._moved()
        context = self._context
        pending: dict[str, int] = {}
        for name, number in self._pending():
            pending[name] = max(pending.get(name, 0), number + 1)
        if context is None or moved is None or len(context.runs) != len(self._slots):
            # A new run (a clone, a proposal), a run taken back, or no feed yet: every run, in
            # the runs' order (a new run comes last in the context too).
            if context is None or len(context.runs) > len(self._slots):
                context = self._context = Context({}, 0.0)
                self._done.clear()
            names = list(self._slots)
        else:
            # The runs pending here moved too: their chunk counts as done before it is
            # recorded.
            names = sorted((moved | pending.keys()) & self._slots.keys(), key=context.order)
        elsewhere = self._elsewhere()
        context.update(self._histories(names, pending, elsewhere), self._clock())
        self._unasked.update(names)
        return context

    def take_fresh(self) -> list[str]:
        """The runs with chunks done since the policy was last asked about them (in the runs'
        order, as of the last :meth:`refresh`), which are then taken as asked."""
        if not self._unasked:
            return []
        assert self._context is not None  # refreshed first
        fresh = sorted((n for n in self._unasked if self._done[n] > self._asked.get(n, 0)),
                       key=self._context.order)
        self._unasked.clear()
        for name in fresh:
            self._asked[name] = self._done[name]
        return fresh

    def _histories(self, names: Iterable[str], pending: dict[str, int],
                   elsewhere: set[str]) -> Iterator[RunHistory]:
        for name in names:
            slot = self._slots[name]
            done = max(slot.state.chunks_done, pending.get(name, 0))
            self._done[name] = done
            self.histories_built += 1
            yield history_of(slot, done, training=name in elsewhere)

