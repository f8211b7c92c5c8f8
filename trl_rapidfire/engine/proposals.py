"""Runs an adaptive search proposes while the experiment trains (Optuna's samplers, say).

Whenever fewer than the search's ``max_concurrent`` runs are in the rotation, the search is
asked for the next run, which joins as a new run; whenever a run leaves the rotation
(completed, stopped by a person or a policy, failed, deleted), the search is told its result,
once. Both happen under the shared state's lock, so with several workers every run is
proposed once and every result told once, whichever worker does it. A proposed run's recipe
(its trial number and the sampler's parameters) goes into the shared state, from which the
other workers, and a re-run after a crash, build the same run.

The engine knows the search only through :class:`Proposer`; the trainer layer's
:class:`~.run_trainer.RunFactory` builds the runs it proposes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..control.policies import RunHistory
from ..shared_state.scheduler import Order
from ..shared_state.store import StateStore, is_proposal
from ..storage.layout import Layout, run_index, run_name
from .building import register_failed
from .clones import next_run_index
from .coordination import Coordinator
from .records import RunSlot, history_of
from .run_trainer import NewRun, RunFactory

__all__ = ["PolicyVerdicts", "Proposal", "Proposals", "Proposer"]


@dataclass(frozen=True)
class Proposal:
    """A run an adaptive search proposed while the experiment trains.

    Attributes:
        name: the run's name.
        trial: the search's number for it (Optuna's trial number).
        knobs: the knob values chosen (as a :class:`RunSpec` holds them).
        params: the search's own record of the choice, as JSON text (what other workers and
            a re-run rebuild the run from).
        tags: the run's first tracking tags (which trial, proposed by what, when).
    """

    name: str
    trial: int
    knobs: dict[str, Any]
    params: str
    tags: dict[str, str] = field(default_factory=dict)


class Proposer(Protocol):
    """An adaptive search, as the engine asks it (called under the shared state's lock)."""

    max_concurrent: int
    order: Order  # which runs in the rotation train first (see shared_state.scheduler)

    def more(self) -> bool:
        """Whether it may propose another run."""

    def propose(self, name: str) -> Proposal:
        """The next run, to be named ``name`` (only when :meth:`more`)."""

    def from_recipe(self, name: str, trial: int, params: str) -> Proposal:
        """The run ``name`` that trial ``trial`` proposed with ``params`` (a recipe in the
        shared state). Raises ``ValueError`` when the params are not the search's."""

    def report(self, history: RunHistory) -> None:
        """The run trained more chunks: record the metric's values at their ends so far (the
        trial's intermediate values, as ``trial.report`` would)."""

    def tell(self, history: RunHistory, pruned_at_end: bool = False) -> str | None:
        """The run left the rotation: record its result (at most once per run, whoever asks;
        ``pruned_at_end``: the policy found the completed run a loser at its last
        evaluation). Returns what was recorded, for the logs, or ``None`` when nothing was
        (told before)."""


class PolicyVerdicts(Protocol):
    """What the search's side of the loop asks the experiment's policy (the ops desk)."""

    def admits_new_runs(self) -> bool:
        """Whether the policy lets the search start another run now."""

    def pruned_at_end(self, run: str) -> bool | None:
        """Whether the policy found the completed ``run`` a loser at its last evaluation
        (``None``: not known here)."""


class Proposals:
    """Asks the search for runs and tells it their results, at the loop's every turn.

    Args:
        proposer: the search; ``None``: the experiment's runs are all known up front.
        layout, store, slots, shared: the experiment's paths, its shared state, the engine's
            runs, this worker's view of the shared state.
        runs: builds a proposed run's trainer.
        register: registers a built run (:meth:`~.building.RunRegistry.register`).
        replanned: told when new runs change the experiment's chunk count.
        policy: the experiment's policy, as far as the search needs it: whether it lets the
            search start another run now (a spent budget does not), and whether it found a
            completed run a loser at its end; ``None``: no policy.
    """

    def __init__(
        self, *, proposer: Proposer | None, layout: Layout, store: StateStore,
        slots: dict[str, RunSlot], shared: Coordinator, runs: RunFactory | None,
        register: Callable[[NewRun], RunSlot], replanned: Callable[[], None],
        policy: PolicyVerdicts | None = None,
    ) -> None:
        self.proposer = proposer
        self.layout = layout
        self.store = store
        self.slots = slots
        self._shared = shared
        self._runs = runs
        self._register = register
        self._replanned = replanned
        self._policy = policy
        self._told: set[str] = set()
        self._reported: dict[str, int] = {}  # run -> chunks whose values the study has
        self._checked = False  # the first step of this process always looks

    def step(self) -> bool:
        """Tell the search about the runs that left the rotation and ask it for new ones
        while the rotation has room; say in the shared state whether more may come. Returns
        whether runs were added."""
        proposer = self.proposer
        if proposer is None:
            return False
        self._report(proposer)
        leaving = any(not s.state.status.schedulable and n not in self._told
                      for n, s in self.slots.items())
        rotation = sum(1 for s in self.slots.values() if s.state.status.schedulable)
        if self._checked and not leaving and not (rotation < proposer.max_concurrent
                                                  and proposer.more()):
            return False
        self._checked = True
        added = False
        with self.store.transaction() as st:
            self._shared.sync(st)
            for name, record in st.runs.items():
                slot = self.slots.get(name)
                if record.status.schedulable or name in self._told or slot is None:
                    continue
                # A verdict not known here (another worker trained its end) counts as none.
                judged = self._policy is not None and bool(self._policy.pruned_at_end(name))
                proposer.tell(history_of(slot, record.chunks_done), pruned_at_end=judged)
                self._told.add(name)
            rotation = sum(1 for r in st.runs.values() if r.status.schedulable)
            admitted = rotation >= proposer.max_concurrent or (
                self._policy is None or self._policy.admits_new_runs())
            while rotation < proposer.max_concurrent and admitted and proposer.more():
                name = run_name(next_run_index(st.runs, self.slots))
                proposal = proposer.propose(name)
                slot = self._build(proposal)
                st.add_run(name, len(slot.plan), slot.json_knobs())
                st.clones[name] = {"trial": str(proposal.trial), "params": proposal.params}
                if slot.gang:
                    st.gang_size[name] = slot.gang
                if slot.trainer is None:
                    st.runs[name].fail(slot.outcome.error or "could not be set up")
                    proposer.tell(history_of(slot, 0))
                    self._told.add(name)
                else:
                    rotation += 1
                added = True
            st.searching = admitted and proposer.more()
            self._shared.sync(st)
        if added:
            self._replanned()
        return added

    def _report(self, proposer: Proposer) -> None:
        """The chunks this worker trained and recorded since it last looked, reported to the
        study by it alone (the others have no newer values of them)."""
        for name, slot in self.slots.items():
            done = slot.state.chunks_done
            if (slot.state.status.schedulable and done > self._reported.get(name, 0)
                    and slot.turn.local_chunks >= done):
                proposer.report(history_of(slot, done))
                self._reported[name] = done

    def build_from_recipe(self, name: str, recipe: dict[str, str]) -> None:
        """Build the proposed run ``name`` another worker (or an earlier session) added,
        from its recipe in the shared state; if it cannot be built here, it alone fails."""
        if self.proposer is None or not is_proposal(recipe):
            raise RuntimeError(f"cannot build {name}: {recipe!r} is a search's proposal, and "
                               "this experiment has no adaptive search")
        try:
            proposal = self.proposer.from_recipe(name, int(recipe["trial"]), recipe["params"])
        except ValueError as err:
            slot = self._failed(name, {}, RuntimeError(
                f"cannot rebuild {name} from {self.store.path}: {err}"))
        else:
            slot = self._build(proposal)
        if slot.trainer is None:
            with self.store.transaction() as st:
                record = st.runs.get(name)
                if record is not None and record.status.schedulable:
                    record.fail(slot.outcome.error or "could not be set up")
                self._shared.sync(st)
        self._replanned()

    def _build(self, proposal: Proposal) -> RunSlot:
        """Build and register the proposed run; a run that cannot be built is registered as
        failed (the search is told), and the others train on."""
        try:
            if self._runs is None:
                raise RuntimeError("this experiment cannot build new runs")
            new = self._runs.new(proposal.name, proposal.knobs)
            new.tags.update(proposal.tags)
            return self._register(new)
        except Exception as err:  # noqa: BLE001 - that run fails, the others go on
            if self._runs is not None:
                self._runs.undo(proposal.name)
            self.slots.pop(proposal.name, None)
            return self._failed(proposal.name, proposal.knobs, err)

    def _failed(self, name: str, knobs: dict[str, Any], error: BaseException) -> RunSlot:
        index = run_index(name)
        return register_failed(self.slots, name=name, index=-1 if index is None else index,
                               knobs=knobs, group=None, run_dir=self.layout.run_dir(name),
                               error=error, stacklevel=4)
