"""What every policy shares: the context of the runs' histories it reads, the decisions it
makes, the Policy ABC, combining several (a run's history and reading a metric from it are in
:mod:`.history`, re-exported here)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

# Re-exported: a policy's module imports what it reads a run with from here (its home is
# .history, which .rungs imports too).
from .history import RunHistory as RunHistory
from .history import chunk_values as chunk_values
from .history import metric_at as metric_at
from .rungs import Rung


class Context:
    """Everything a policy sees at a chunk end.

    Made once by the engine and kept up to date (:meth:`update`) with the runs that moved
    since the policy last looked, so that a decision costs what changed, not the number of
    runs: :meth:`rung` answers questions about the runs at one chunk count from an index kept
    in step with the histories. A context made by hand (``Context(runs)``) is the same
    snapshot, indexed on first use.

    Attributes:
        runs: every run of the experiment by name (clones included, as they appear).
        wall_seconds: time the experiment has trained so far, over all its sessions.
        version: how many times :meth:`update` changed it; a policy that keeps something
            derived from it brings that up to date with :meth:`changed_since`.
    """

    def __init__(self, runs: Mapping[str, RunHistory], wall_seconds: float = 0.0) -> None:
        self._runs: dict[str, RunHistory] = dict(runs)
        self._order = {name: i for i, name in enumerate(self._runs)}
        self.wall_seconds = wall_seconds
        # The runs each update replaced, one after another, and where each update's end:
        # flat lists (a pointer a name) since an experiment updates at every boundary.
        self._changed: list[str] = []
        self._ends: list[int] = []
        self._rungs: dict[tuple[str, str, int], Rung] = {}
        self._total_steps: int | None = None

    @property
    def runs(self) -> Mapping[str, RunHistory]:
        return self._runs

    def update(self, histories: Iterable[RunHistory], wall_seconds: float) -> None:
        """Replace these runs' histories (a new run is added at the end) and the wall time."""
        changed = []
        for new in histories:
            old = self._runs.get(new.name)
            order = self._order.setdefault(new.name, len(self._order))
            self._runs[new.name] = new
            changed.append(new.name)
            for rung in self._rungs.values():
                rung.replace(old, new, order)
            if self._total_steps is not None:
                self._total_steps += _steps(new) - (_steps(old) if old is not None else 0)
        self._changed.extend(changed)
        self._ends.append(len(self._changed))
        self.wall_seconds = wall_seconds

    @property
    def version(self) -> int:
        return len(self._ends)

    def changed_since(self, version: int) -> set[str]:
        """The runs replaced since the context was at ``version``."""
        start = self._ends[version - 1] if 0 < version <= len(self._ends) else 0
        return set(self._changed[start:]) if version < len(self._ends) else set()

    def rung(self, metric: str, chunks: int, mode: str = "min") -> Rung:
        """The runs at ``chunks`` chunks judged by ``metric`` (see :class:`~.rungs.Rung`),
        indexed on first use and kept up to date from then on."""
        key = (metric, mode, chunks)
        rung = self._rungs.get(key)
        if rung is None:
            rung = self._rungs[key] = Rung(metric, chunks, mode)
            for name, history in self._runs.items():
                rung.replace(None, history, self._order[name])
        return rung

    def order(self, run: str) -> int:
        """The run's place among the experiment's runs (the order they appeared in)."""
        return self._order[run]

    @property
    def total_steps(self) -> int:
        """Optimizer steps trained so far, summed over every run."""
        if self._total_steps is None:
            self._total_steps = sum(_steps(h) for h in self._runs.values())
        return self._total_steps


def _steps(history: RunHistory) -> int:
    done, ends = history.chunks_done, history.chunk_ends
    return ends[done - 1] if 0 < done <= len(ends) else 0


@dataclass(frozen=True)
class Decision:
    """One automatic control op.

    Attributes:
        run: the run it applies to (for ``clone``: the parent).
        action: ``stop`` (resumable), ``fail`` (with the reason), or ``clone``.
        reason: why, as it should read in the op log (``by <policy>`` is added).
        overrides: for ``clone``, the knob overrides.
        warm: for ``clone``, start from the parent's weights.
        by: the policy that decided (filled in by :class:`Policies`; empty: the policy
            asked).
        replaces: for ``clone``, the run whose stop it comes with (``PopulationBased``'s
            exploit): where that stop does not stand (a person resumed the run, see
            docs/policies.md), the clone is not made either.
    """

    run: str
    action: Literal["stop", "fail", "clone"]
    reason: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    warm: bool = False
    by: str = ""
    replaces: str | None = None


class Policy(ABC):
    """Asked at every chunk end; returns the decisions to carry out (none: all continue)."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def metrics(self) -> tuple[str, ...]:
        """The logged metrics this policy judges runs by (its ``metric``, if it has one): an
        ``eval_*`` one needs every run to evaluate, which is checked before anything trains."""
        metric = getattr(self, "metric", None)
        return (metric,) if isinstance(metric, str) else ()

    @abstractmethod
    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        """``run`` has just finished a chunk; ``context`` shows every run as of now."""

    def evaluates_at(self, run: str, chunks: int, chunks_total: int) -> bool:
        """Whether this policy may read ``run``'s metric at its boundary after ``chunks`` of
        its ``chunks_total`` chunks: with ``eval_strategy="policy"`` a run is evaluated there
        (and at its last chunk) and nowhere else. A policy that does not say is assumed to
        look at every boundary; one that never reads a metric (a :class:`Budget`) says no."""
        return True

    def admits_new_runs(self, context: Context) -> bool:
        """Whether an adaptive search may start another run now (a spent :class:`Budget`
        says no: the runs it stopped would otherwise be replaced, one chunk each)."""
        return True

    def pruned_at_end(self, run: str) -> bool | None:
        """Whether this policy, asked about ``run``'s last evaluation, found it a loser
        although it had finished training: an adaptive search then records the run as pruned,
        as Optuna's own loop does when the pruner says so after a trial's last report
        (transformers' ``hyperparameter_search``). ``None``: its last boundary not judged yet.
        A policy that does not judge finished runs says ``False``."""
        return False


class Policies(Policy):
    """Several policies asked in order; each run gets at most one stop or fail (the first).
    Clones are not decisions about their parent: all of them are kept."""

    def __init__(self, policies: Iterable[Policy]) -> None:
        self.policies = list(policies)
        for p in self.policies:
            if not isinstance(p, Policy):
                raise TypeError(f"{p!r} is not a Policy (SuccessiveHalving, Budget, ...)")

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        decided: dict[str, Decision] = {}
        out = []
        for policy in self.policies:
            for d in policy.on_chunk_end(run, context):
                # The op log names the policy that decided, not this combination.
                d = replace(d, by=d.by or policy.name)
                if d.action != "clone":
                    if d.run in decided:
                        continue
                    decided[d.run] = d
                out.append(d)
        return out

    def admits_new_runs(self, context: Context) -> bool:
        return all(p.admits_new_runs(context) for p in self.policies)

    def pruned_at_end(self, run: str) -> bool | None:
        verdicts = [p.pruned_at_end(run) for p in self.policies]
        return True if True in verdicts else None if None in verdicts else False

    def evaluates_at(self, run: str, chunks: int, chunks_total: int) -> bool:
        return any(p.evaluates_at(run, chunks, chunks_total) for p in self.policies)

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m for p in self.policies for m in p.metrics))


def check_mode(mode: str) -> None:
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")


def check_metric(metric: Any) -> None:
    """A policy's metric is the name of a logged value (``eval_loss``, ``loss``, ...)."""
    if not isinstance(metric, str) or not metric.strip():
        raise ValueError(f"metric must name a logged value such as 'eval_loss' or 'loss', got "
                         f"{metric!r}")


def as_policy(policy: Policy | Sequence[Policy] | None) -> Policy | None:
    """What the trainers accept as ``policy=``: one policy, a list of them, or ``None``."""
    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, Sequence) and not isinstance(policy, (str, bytes)):
        return Policies(policy)
    raise TypeError(f"policy must be a Policy (SuccessiveHalving(...), Budget(...)) or a list "
                    f"of them, got {policy!r}")
