"""The experiment's shared scheduler state, for workers that cooperate across processes.

Every worker of an experiment (one per process under ``accelerate launch``) claims its next
(run, chunk) from one shared state, so each chunk is trained by exactly one worker. The state
is a small document changed only inside a transaction of its store
(:class:`~trl_rapidfire.shared_state.state_file.FileStore`: under an exclusive file lock, each
change
journalled before the lock is released). A claim carries a lease; a worker that dies
mid-chunk stops renewing it, and once it expires the run can be claimed again from its last
finished chunk.

The scheduling *decisions* are plain functions of the state (:func:`claim_next`,
:func:`finish_chunk`), independent of where the state lives: the file-locked store is the
single-machine backend, and a backend on torch.distributed's key-value store can carry the same
protocol across machines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .runs import RunState, RunStatus
from .scheduler import Order, pick_next
from .state_schema import BadState, check_document, is_proposal
from .worker_info import process_alive

__all__ = [
    "StateStore",
    "Claim",
    "ExperimentState",
    "StoreError",
    "check_state_names",
    "choose",
    "claim_next",
    "expire",
    "fail_claimed",
    "finish_chunk",
    "handoff",
    "is_proposal",
    "mark_durable",
    "release",
    "renew",
    "roll_back",
]

_FORMAT = "trl-rapidfire/scheduler-state"
_VERSION = 1


class StoreError(RuntimeError):
    """The shared state cannot be used as asked (wrong experiment, corrupt file)."""


@dataclass
class Claim:
    """A worker training a run's next chunk, until ``lease_until`` (``time.time()``)."""

    worker: str
    chunk: int
    lease_until: float


@dataclass
class ExperimentState:
    """What all workers share: every run's state, its chunk count, and current claims.

    Attributes:
        fingerprint: identifies the expanded runs; a re-run with other configs is refused.
        runs: run name -> its :class:`~trl_rapidfire.shared_state.runs.RunState`.
        chunks_total: run name -> chunks in its plan.
        order: run names in declaration order (the scheduler's last tie-break).
        claims: run name -> the claim on it, if a worker is training it.
        owner: run name -> the worker that trained its last chunk (affinity: the run's live
            state is on that worker; anywhere else it is restored from its checkpoint). While
            a run has volatile chunks (done since its last durable point) only its owner may
            claim it; if the owner is gone they are lost (:func:`expire`).
        seen: worker -> when it last claimed or renewed (``time.time()``): how a worker on
            another machine, whose process cannot be asked, is known to be gone.
        idle: worker -> since when it has found nothing to claim but other workers' volatile
            runs; their owners write those runs' state so that it can take some
            (:func:`handoff`).
        last_run: worker -> the run it trained last (its state is on the device there).
        ready: the launch whose first worker has set the experiment up (applied the ops its
            script queued before training); the other workers of a launch wait for it.
        clones: run name -> how a run added mid-flight was made, so that every worker, and a
            re-run, can build it again: a clone (``{"parent": ..., "op": ...}``) or a search's
            proposal (``{"trial": ..., "params": ...}``, see :func:`is_proposal`).
        searching: an adaptive search may still add runs: a worker with nothing to train
            waits instead of leaving.
        wall_seconds: the experiment's training wall time over all its sessions, kept by the
            first worker (a wall-clock budget spans re-runs).
        gang_size: run name -> how many workers train it together (FSDP runs: all of them).
        gang: the gang forming or training now, if any: ``{"run", "chunk", "members",
            "done"}`` (worker ids). While it exists every worker that asks for work joins it,
            so it fills as soon as the others finish the chunk they are training.
    """

    fingerprint: str
    runs: dict[str, RunState] = field(default_factory=dict)
    chunks_total: dict[str, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    claims: dict[str, Claim] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    last_run: dict[str, str] = field(default_factory=dict)
    ready: str = ""
    clones: dict[str, dict[str, str]] = field(default_factory=dict)
    wall_seconds: float = 0.0
    gang_size: dict[str, int] = field(default_factory=dict)
    gang: dict[str, Any] | None = None
    searching: bool = False
    seen: dict[str, float] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=dict)

    def add_run(self, name: str, chunks_total: int, knobs: dict[str, Any] | None = None) -> None:
        if name in self.runs:
            return
        self.runs[name] = RunState(name=name, knobs=dict(knobs or {}))
        self.chunks_total[name] = chunks_total
        self.order.append(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT, "version": _VERSION, "fingerprint": self.fingerprint,
            "runs": {n: r.to_json() for n, r in self.runs.items()},
            "chunks_total": self.chunks_total, "order": self.order,
            "claims": {n: asdict(c) for n, c in self.claims.items()},
            "owner": self.owner, "last_run": self.last_run, "clones": self.clones,
            "ready": self.ready, "wall_seconds": self.wall_seconds,
            "gang_size": self.gang_size, "gang": self.gang, "searching": self.searching,
            "seen": self.seen, "idle": self.idle,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ExperimentState:
        if not isinstance(doc, dict):
            raise StoreError("not a trl-rapidfire scheduler state (not a JSON object)")
        if doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
            raise StoreError(f"not a trl-rapidfire scheduler state (format {doc.get('format')!r}, "
                             f"version {doc.get('version')!r})")
        check_state_names(doc)
        return cls(
            fingerprint=doc["fingerprint"],
            runs={n: RunState.from_json(r) for n, r in doc["runs"].items()},
            chunks_total={n: int(v) for n, v in doc["chunks_total"].items()},
            order=list(doc["order"]),
            claims={n: Claim(**c) for n, c in doc["claims"].items()},
            owner=dict(doc.get("owner", {})),
            last_run=dict(doc.get("last_run", {})),
            ready=str(doc.get("ready", "")),
            clones={n: dict(c) for n, c in doc.get("clones", {}).items()},
            wall_seconds=float(doc.get("wall_seconds", 0.0)),
            gang_size={n: int(v) for n, v in doc.get("gang_size", {}).items()},
            gang=doc.get("gang"),
            searching=bool(doc.get("searching", False)),
            seen={w: float(t) for w, t in doc.get("seen", {}).items()},
            idle={w: float(t) for w, t in doc.get("idle", {}).items()},
        )

    def live_claims(self) -> bool:
        """Whether some worker is training a chunk now (a run may still come back)."""
        return bool(self.claims)


class StateStore(Protocol):
    """Where an experiment's shared state lives, as the engine uses it (the seam for another
    backend; :class:`~trl_rapidfire.shared_state.state_file.FileStore` is the one on disk).

    Every change happens inside :meth:`transaction`, which brings this process's copy up to
    date first and makes the body's change visible to every worker once it ends; the decisions
    on the state are this module's plain functions."""

    @property
    def path(self) -> Path:
        """Where a person finds the state (named in messages)."""
        ...

    def transaction(self, durable: bool = True
                    ) -> contextlib.AbstractContextManager[ExperimentState]:
        """The state to read and change, exclusively; ``durable=False``: a change a power cut
        may lose harmlessly (a claim, a lease renewal)."""
        ...

    def take_changed_runs(self) -> set[str] | None:
        """Inside a transaction: the runs changed since the last call, by anyone (``None``:
        possibly all)."""
        ...

    def compact(self) -> None:
        """Fold whatever the backend keeps beside the state into the state itself."""
        ...


def check_state_names(doc: dict[str, Any]) -> None:
    """:class:`StoreError` unless ``doc`` is a whole state as the package writes it: known
    keys, values of their types, every run name ``run-<n>`` (names become paths, recipes become
    runs, and the file may have been edited by someone other than the experiment's author; see
    :mod:`trl_rapidfire.shared_state.state_schema`)."""
    try:
        check_document(doc)
    except BadState as err:
        raise StoreError(f"{err}: the file was edited or damaged; restore it, or use another "
                         "output_dir") from None


def claim_next(
    state: ExperimentState, worker: str, *, now: float, lease_seconds: float,
    alive: Callable[[str], bool | None] = process_alive,
    pick: Callable[[ExperimentState, str], str | None] | None = None,
) -> tuple[str, int] | None:
    """Claim the next (run, chunk) for ``worker`` under the scheduler's rule, or ``None``.

    ``pick``: what applies the rule (default :func:`choose`, a pass over every run; a worker
    passes its :class:`~trl_rapidfire.shared_state.run_queue.RunQueue`, which answers the same).

    Runs claimed by another worker are skipped while that worker lives: a claim is dropped
    when its lease expired or ``alive(worker)`` says the worker is gone (a worker on this
    machine that died, e.g. killed with the whole experiment); the run then restarts its chunk
    from its last boundary. Among equally advanced runs, those this worker trained last win
    (their state is live here).
    """
    expire(state, now=now, alive=alive, lease_seconds=lease_seconds)
    state.seen[worker] = now
    gang = state.gang
    if gang is not None:
        if worker in gang["done"]:
            return None  # its part is done: wait for the others to finish theirs
        # Nobody starts a single run while a gang forms: it fills within one chunk's time.
        if worker not in gang["members"]:
            gang["members"].append(worker)
        state.last_run[worker] = gang["run"]
        return gang["run"], gang["chunk"]
    name = (pick or choose)(state, worker)
    if name is None:
        if any(r.volatile and state.owner.get(n, worker) != worker and n not in state.claims
               for n, r in state.runs.items()):
            state.idle[worker] = now  # others hold runs it could train: they hand some over
        return None
    state.idle.pop(worker, None)
    run = state.runs[name]
    if run.status == RunStatus.PENDING:
        run.move(RunStatus.RUNNING)
    state.claims[name] = Claim(worker, run.chunks_done, now + lease_seconds)
    state.last_run[worker] = name
    if name in state.gang_size:
        state.gang = {"run": name, "chunk": run.chunks_done, "members": [worker], "done": []}
    return name, run.chunks_done


def choose(state: ExperimentState, worker: str,
           finishing: Collection[str] = frozenset(), order: Order = Order.EVEN) -> str | None:
    """The run the scheduler's rule gives ``worker`` next (nothing is claimed).

    ``finishing``: runs this worker still holds while their last chunk's checkpoint is being
    written; they count as if that chunk were recorded, so the caller can tell whether to
    wait for one of them rather than move on to another run. ``order``: the scheduler's
    (:class:`~trl_rapidfire.shared_state.scheduler.Order`).
    """
    runs, totals, claims, owner = state.runs, state.chunks_total, state.claims, state.owner
    views = (
        (n, i, runs[n].status, runs[n].chunks_done + (n in finishing), totals[n])
        for i, n in enumerate(state.order) if (n not in claims or n in finishing)
        # Volatile chunks live in their owner only: nobody else can continue from them.
        and (owner.get(n, worker) == worker or not runs[n].volatile)
    )
    return pick_next(views, resident=state.last_run.get(worker), local=_Owned(owner, worker),
                     order=order)


class _Owned:
    """The runs ``worker`` owns, asked run by run (no set of them built at every claim)."""

    def __init__(self, owner: dict[str, str], worker: str) -> None:
        self.owner, self.worker = owner, worker

    def __contains__(self, name: object) -> bool:
        return self.owner.get(name) == self.worker  # type: ignore[call-overload]


def expire(state: ExperimentState, *, now: float,
           alive: Callable[[str], bool | None] = process_alive,
           lease_seconds: float | None = None) -> list[str]:
    """Drop the claims of workers that are gone or whose lease ran out; returns their runs.

    A gone worker's volatile chunks are lost with it: its runs go back to their last durable
    point (see :func:`roll_back`). Gone: its process is not alive on this machine, or, on
    another machine, it has not claimed or renewed for ``lease_seconds``."""
    for worker, seen in list(state.seen.items()):
        live = alive(worker)
        if live is False or (live is None and lease_seconds is not None
                             and seen + lease_seconds < now):
            roll_back(state, worker)
            del state.seen[worker]
            state.idle.pop(worker, None)
    dropped = []
    for name, claim in list(state.claims.items()):
        if claim.lease_until <= now or alive(claim.worker) is False:
            del state.claims[name]
            dropped.append(name)
    gang = state.gang
    if gang is not None and (gang["run"] in dropped or gang["run"] not in state.claims
                             or any(alive(w) is False for w in gang["members"])):
        # A member is gone: the others are stuck in (or will fail out of) a collective; the
        # chunk is trained again from the last boundary once a gang forms anew.
        state.claims.pop(gang["run"], None)
        state.gang = None
        if gang["run"] not in dropped:
            dropped.append(gang["run"])
    return dropped


def handoff(state: ExperimentState, worker: str) -> list[str]:
    """The runs ``worker`` holds volatile and is not training, when another worker is idle
    for want of them: their state is to be written (then anyone may claim them). The idle
    workers are answered (they ask again if they still find nothing)."""
    if not any(w != worker for w in state.idle):
        return []
    for other in [w for w in state.idle if w != worker]:
        del state.idle[other]
    return [n for n in _volatile_runs_of(state, worker) if n not in state.claims]


def _volatile_runs_of(state: ExperimentState, worker: str) -> list[str]:
    """The runs whose volatile chunks live in ``worker``."""
    return [n for n, who in state.owner.items()
            if who == worker and n in state.runs and state.runs[n].volatile]


def roll_back(state: ExperimentState, worker: str) -> list[str]:
    """``worker`` is gone: the chunks its runs did since their last durable point are lost,
    and the runs continue from there (trained again exactly: the checkpoint holds the random
    streams, data position and optimizer). Returns those runs."""
    lost = _volatile_runs_of(state, worker)
    for name in lost:
        record = state.runs[name]
        record.chunks_done, record.global_step = record.durable_chunks, record.durable_step
    return lost


def mark_durable(state: ExperimentState, run: str, worker: str, chunks: int, step: int) -> bool:
    """``worker`` wrote ``run``'s checkpoint at its boundary after ``chunks`` chunks (step
    ``step``), after they were recorded: they are durable now. ``False`` if the record moved
    meanwhile (the checkpoint is not of its last chunk)."""
    record = state.runs.get(run)
    if record is None or state.owner.get(run) != worker or record.chunks_done != chunks:
        return False
    record.durable_chunks, record.durable_step = chunks, step
    return True


def renew(state: ExperimentState, run: str, worker: str, *, now: float,
          lease_seconds: float) -> bool:
    """Extend ``worker``'s lease on ``run``; ``False`` if it no longer holds it."""
    state.seen[worker] = now
    claim = state.claims.get(run)
    if claim is None or claim.worker != worker:
        return False
    claim.lease_until = now + lease_seconds
    return True


def finish_chunk(state: ExperimentState, run: str, worker: str, chunk: int, *,
                 global_step: int | None = None, complete: bool = False,
                 durable: bool = True) -> bool:
    """Record that ``worker`` finished ``chunk`` of ``run`` and release the claim.

    ``complete``: the run's ``train()`` ended with this chunk (also when a callback ended it
    before its plan did); its final weights are on disk. ``durable``: the chunk's boundary
    checkpoint is on disk; without it the chunk is volatile (see :func:`roll_back`).

    Returns ``False`` (and changes nothing) if the claim was lost meanwhile (lease expired and
    taken over): that chunk's work must be discarded, another worker is redoing it.
    """
    claim = state.claims.get(run)
    if claim is None or claim.worker != worker or claim.chunk != chunk:
        return False
    del state.claims[run]
    record = state.runs[run]
    record.chunks_done = state.chunks_total[run] if complete else chunk + 1
    if global_step is not None:
        record.global_step = global_step
    if durable or complete:
        record.durable_chunks, record.durable_step = record.chunks_done, record.global_step
    state.owner[run] = worker
    if record.chunks_done >= state.chunks_total[run]:
        if record.status == RunStatus.STOPPED:
            # Stopped while its last chunk was being trained: nothing is left to resume.
            record.move(RunStatus.RUNNING)
        if record.status == RunStatus.RUNNING:
            record.move(RunStatus.COMPLETED)
    return True


def fail_claimed(state: ExperimentState, run: str, worker: str, error: str) -> bool:
    """The run failed in ``worker``'s hands: release the claim and mark it failed."""
    claim = state.claims.get(run)
    gang = state.gang
    if gang is not None and gang["run"] == run and worker in gang["members"]:
        state.gang = None  # a gang run fails for all its members, whoever holds the claim
    elif claim is not None and claim.worker != worker:
        return False
    if claim is None:
        return False
    del state.claims[run]
    record = state.runs[run]
    if record.status != RunStatus.DELETED:
        record.fail(error)
    return True


def release(state: ExperimentState, run: str, worker: str) -> bool:
    """Give a claim back unfinished (the worker is leaving); the chunk will be trained again."""
    gang = state.gang
    if gang is not None and gang["run"] == run and worker in gang["members"]:
        state.gang = None  # the others cannot train it without this worker
        state.claims.pop(run, None)
        return True
    claim = state.claims.get(run)
    if claim is None or claim.worker != worker:
        return False
    del state.claims[run]
    return True
