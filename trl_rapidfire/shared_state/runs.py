"""The run state machine, written down in one place.

A run is one configuration of a config group. Its status moves only along the transitions in
:data:`TRANSITIONS`; everything that changes a status (the scheduler, control ops, policies,
crash recovery) goes through :func:`transition`, so an impossible move is an error that names
both states instead of a silent corruption of the experiment.

::

    PENDING ──first chunk claimed──> RUNNING ──last chunk done──> COMPLETED
       │  ╲                            │  ╲──────error───────────> FAILED
       │   ╲──stop──> STOPPED <──stop──┘
       │               │  ╲──resume──> PENDING (never trained) | RUNNING (trained some chunks)
       └──delete──> DELETED <──delete── (any state but DELETED)

RUNNING means *in the rotation*: the run has trained at least one chunk and will get more
turns. Whether a worker is training it at this instant is a claim held in the shared store, not
a status, so a crashed worker never leaves a run stuck in a state nobody can leave.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RunStatus",
    "SCHEDULABLE",
    "TRANSITIONS",
    "IllegalTransition",
    "transition",
    "status_op_refusal",
    "RunState",
    "INTERRUPTED",
    "shown_status",
]


class RunStatus(enum.StrEnum):
    """Where a run is in its life. The values are what MLflow tags and the CLI show."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    COMPLETED = "completed"
    DELETED = "deleted"
    FAILED = "failed"

    @property
    def schedulable(self) -> bool:
        """Whether the scheduler may give this run its next chunk."""
        return self in SCHEDULABLE

    @property
    def terminal(self) -> bool:
        """No transition leads out of this status except (for some) deletion."""
        return self in (RunStatus.COMPLETED, RunStatus.DELETED, RunStatus.FAILED)


_S = RunStatus
SCHEDULABLE: frozenset[RunStatus] = frozenset({_S.PENDING, _S.RUNNING})
"""The statuses whose runs the scheduler may give a chunk."""

TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    _S.PENDING: frozenset({_S.RUNNING, _S.STOPPED, _S.DELETED, _S.FAILED}),
    _S.RUNNING: frozenset({_S.COMPLETED, _S.FAILED, _S.STOPPED, _S.DELETED}),
    _S.STOPPED: frozenset({_S.PENDING, _S.RUNNING, _S.DELETED}),
    # A finished or failed run can still be deleted from the comparison; nothing else.
    _S.COMPLETED: frozenset({_S.DELETED}),
    _S.FAILED: frozenset({_S.DELETED}),
    _S.DELETED: frozenset(),
}
"""Allowed moves: ``TRANSITIONS[current]`` is the set of statuses ``current`` may move to."""


INTERRUPTED = "interrupted"
"""What views show for a run in the rotation of an experiment that is not training (Ctrl-C,
a crash, a kill): not a status of the state machine (the run is RUNNING, and a re-run gives it
its next chunk), but what a person must read instead of "running"."""


def shown_status(status: RunStatus | str | None, *, training: bool) -> str:
    """What a view (``status``, the panels, the report) shows for a run whose status (or
    status tag) is ``status`` while its experiment is (or is not) ``training``: a run in the
    rotation of an experiment that is not training is :data:`INTERRUPTED`."""
    if status is None:
        return "-"
    text = status.value if isinstance(status, RunStatus) else str(status)
    return INTERRUPTED if not training and text == RunStatus.RUNNING.value else text


def status_op_refusal(name: str, status: RunStatus, verb: str) -> str | None:
    """Why the status op ``verb`` (stop, resume, delete, fail) cannot apply to run ``name``
    in ``status``, or ``None`` when it can. The engine applies ops by it and the CLI refuses
    by it before sending one, so both give the same reason."""
    status = RunStatus(status)
    if status == RunStatus.DELETED:
        return f"{name} is deleted; no op applies to it"
    if verb in ("stop", "fail") and not status.schedulable:
        what = "stop" if verb == "stop" else "fail"
        return f"{name} is {status.value}; only pending or running runs {what}"
    if verb == "resume" and status != RunStatus.STOPPED:
        return f"{name} is {status.value}; only a stopped run can be resumed"
    return None


class IllegalTransition(ValueError):
    """A status change the state machine does not allow (e.g. resuming a completed run)."""


def transition(current: RunStatus, new: RunStatus, *, run: str = "run") -> RunStatus:
    """Check the move ``current -> new`` and return ``new``.

    Raises:
        IllegalTransition: naming the run, both statuses and the moves that are allowed.
    """
    current, new = RunStatus(current), RunStatus(new)
    if new not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "none"
        raise IllegalTransition(
            f"{run} is {current.value} and cannot become {new.value} (allowed: {allowed})."
        )
    return new


@dataclass
class RunState:
    """What the scheduler knows about one run (no tensors: those live in the state cache).

    Attributes:
        name: ``run-<n>``; clones get fresh names.
        knobs: the run's knob values in a JSON-friendly form (for tables, tags and the store).
        status: see :class:`RunStatus`.
        chunks_done: chunks trained so far, over all epochs.
        global_step: optimizer steps done (the trainer's ``state.global_step``).
        error: why the run failed, when it did.
        parent: the run this one was cloned from, if any.
        warm_start: whether a clone started from its parent's weights.
        durable_chunks, durable_step: the run's last durable point (its checkpoint, or its
            final weights, is on disk there). Chunks done beyond it are *volatile*: they live
            in the worker that trained them (``ExperimentState.owner``) and are trained again
            if it is gone (see :mod:`trl_rapidfire.config.cadence`).
    """

    name: str
    knobs: dict[str, Any] = field(default_factory=dict)
    status: RunStatus = RunStatus.PENDING
    chunks_done: int = 0
    global_step: int = 0
    error: str | None = None
    parent: str | None = None
    warm_start: bool = False
    durable_chunks: int = 0
    durable_step: int = 0

    @property
    def volatile(self) -> bool:
        """Whether chunks were done since the run's last durable point."""
        return self.chunks_done > self.durable_chunks

    def __setattr__(self, key: str, value: Any) -> None:
        object.__setattr__(self, key, value)
        touched = self.__dict__.get("_touched")
        if touched is not None:
            touched.add(self.name)

    def watch(self, touched: set[str]) -> None:
        """From now on, every change of this record adds its name to ``touched``: the shared
        state's file journals the records that changed, without comparing them all."""
        object.__setattr__(self, "_touched", touched)

    def move(self, new: RunStatus) -> None:
        """Change status along an allowed transition (see :func:`transition`)."""
        self.status = transition(self.status, new, run=self.name)

    def resume(self) -> None:
        """Bring a stopped run back into the rotation, where it left off."""
        self.move(RunStatus.RUNNING if self.chunks_done else RunStatus.PENDING)

    def fail(self, error: str) -> None:
        """Mark the run failed and keep why."""
        self.move(RunStatus.FAILED)
        self.error = error

    def copy(self) -> RunState:
        """An independent copy, not watched (its knobs shared: they never change in place)."""
        new = object.__new__(RunState)
        fields = dict(self.__dict__)
        fields.pop("_touched", None)
        new.__dict__.update(fields)
        return new

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly dict (status as its string value)."""
        return {
            "name": self.name, "knobs": self.knobs, "status": self.status.value,
            "chunks_done": self.chunks_done, "global_step": self.global_step,
            "error": self.error, "parent": self.parent, "warm_start": self.warm_start,
            "durable_chunks": self.durable_chunks, "durable_step": self.durable_step,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunState:
        """Inverse of :meth:`to_json`; unknown keys are an error (a store from a newer version)."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"Unknown run-state keys {sorted(unknown)}.")
        # A state written before checkpoint_every existed: every recorded chunk was durable.
        durable = {"durable_chunks": data.get("chunks_done", 0),
                   "durable_step": data.get("global_step", 0)}
        return cls(**{**durable, **data, "status": RunStatus(data.get("status", "pending"))})
