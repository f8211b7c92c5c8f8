"""The engine's record of one run (:class:`RunSlot`): its trainer, its plan, where its weights
are, and everything its turns must not lose; and what a ``run()`` call reports back."""

from __future__ import annotations

import concurrent.futures
import enum
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.knobs import describe_value
from ..control.policies import RunHistory
from ..reports.results import RunResult, latest_metrics
from ..runtime.models import ModelGroup
from ..runtime.residency import Residency
from ..runtime.switch import RngState, RunCoroutine
from ..shared_state.runs import RunState
from ..storage.schedule import ChunkRecord
from .chunks import ChunkPlan
from .run_trainer import EvalCadence, RunTrainer

__all__ = ["ClaimLost", "DiskFault", "Durability", "EngineStats", "LoopHooks", "Outcome",
           "PendingChunk", "Recorded", "Recording", "RunFailure", "RunSlot", "StateUnwritable",
           "TurnState", "WarmStart", "WeightsAt", "WriteFailed", "Written", "history_of"]


class RunFailure(RuntimeError):
    """Every run of the experiment failed; the message lists each run's error.

    ``exceptions``: each run's exception, by run name, where this process saw it raised (a run
    failed on another worker is known by its message only); they are also the
    ``__cause__`` (an ``ExceptionGroup``). An experiment of one run raises that run's own
    exception instead."""

    def __init__(self, message: str, exceptions: dict[str, BaseException] | None = None):
        super().__init__(message)
        self.exceptions = dict(exceptions or {})
        errors = [e for e in self.exceptions.values() if isinstance(e, Exception)]
        if errors:
            self.__cause__ = ExceptionGroup("the runs' errors", errors)


@dataclass
class LoopHooks:
    """Where a test or a tool watches the engine's loop, in the loop's own thread: what it may
    do there is what a person's Python call may do (queue an op, build a config)."""

    # At every chunk boundary, before the loop looks for pending ops.
    at_boundary: Callable[[], None] | None = None
    # Right before a run is switched in (for its turn, or to be the best run's face).
    before_switch_in: Callable[[RunSlot], None] | None = None


@dataclass
class EngineStats:
    """Where the experiment's wall time went (seconds).

    ``compute`` is time the runs spent inside their own turns (training steps, their logging,
    evaluation and saving); ``switching`` is the rest of the loop: parking and unparking state,
    restoring RNG and accelerate state, coroutine switches, scheduling and bookkeeping.
    """

    wall: float = 0.0
    compute: float = 0.0
    turns: int = 0
    # Boundary checkpoints: how many, the time spent on them inside the runs' turns (counted
    # in ``switching``, not ``compute``: serializing, RNG streams) and on the writer thread
    # while the next run trains (the files and their fsyncs); and the boundaries left
    # volatile by ``checkpoint_every``.
    checkpoints: int = 0
    volatile_boundaries: int = 0
    checkpoint_in_turn: float = 0.0
    checkpoint_writing: float = 0.0
    # Evaluations the engine asked for at chunk ends, and their time (inside ``compute``).
    evaluations: int = 0
    evaluation_seconds: float = 0.0
    # Asking the policy at chunk ends (keeping its context up to date included), and the run
    # histories made for it: the runs that moved, not every run at every boundary.
    policy_seconds: float = 0.0
    policy_histories: int = 0

    @property
    def switching(self) -> float:
        return max(self.wall - self.compute, 0.0)


class WeightsAt(enum.Enum):
    """Where a run's current weights (and optimizer moments) are.

    Whether this process's tensors of the run are on the device or parked in the state cache
    is a separate fact, ``RunSlot.residency.resident``: a run whose current weights are on
    disk may still hold older tensors here, resident or parked like any run's, until its next
    switch-in gives its parameters room for the values from disk.
    """

    # In this process's tensors (resident, or parked in the state cache).
    LIVE = "live"
    # In the boundary checkpoint ``resume_from`` (the run was trained elsewhere): its next
    # switch-in gives its parameters room, and its train() loads them.
    CHECKPOINT = "checkpoint"
    # In ``final_dir`` (the run was finished elsewhere): loaded when the run is activated.
    FINAL = "final"


@dataclass
class TurnState:
    """What a run's turns in this process hand on to each other: its suspended ``train()``,
    what is put back when it is switched in, and its compute time. Owned by
    :class:`~.turns.Turns` and the run's :class:`~.callback.ChunkCallback` (its turn's two
    ends); the coordinator moves ``local_chunks`` when the shared state says the run went on
    elsewhere."""

    coroutine: RunCoroutine | None = None
    # Put back at every switch-in (captured when the trainer was attached, then at every
    # switch-out).
    rng: RngState | None = None
    accelerate: list[dict[str, Any]] | None = None
    # Objects the run shares with others that keep state (e.g. a stateful reward function):
    # each has state_dict()/load_state_dict(); the run's own state is put back at every turn.
    stateful: list[Any] = field(default_factory=list)
    stateful_states: list[Any] = field(default_factory=list)
    compute_seconds: float = 0.0
    # When the run's current turn (re)started computing (perf_counter).
    resumed_at: float = 0.0
    # Its train() is suspended at a chunk boundary (where a checkpoint may be taken later).
    at_boundary: bool = False
    # The boundaries at which the run's turn already ended (a turn ends once per boundary).
    yielded_at: set[int] = field(default_factory=set)
    # The random streams as they were before a chunk-end evaluation (put back after it),
    # and when that evaluation was asked for (perf_counter).
    eval_rng: RngState | None = None
    eval_asked: float = 0.0
    # The random streams at an epoch end that is a chunk boundary: (step, streams).
    epoch_end_rng: tuple[int, RngState] | None = None
    # The metric points of the chunk in progress: (key, value, step, time in ms), handed to
    # the tracker at the chunk's end.
    points: list[tuple[str, float, int, int]] = field(default_factory=list)
    # Chunks this worker's live train() has done: behind the shared state's count, the run
    # was trained elsewhere (another worker, an earlier process) and continues from disk.
    local_chunks: int = 0
    # The checkpoint the next train() call resumes from.
    resume_from: Path | None = None
    # Where the run's current weights are (see WeightsAt).
    weights: WeightsAt = WeightsAt.LIVE


@dataclass
class Durability:
    """A run's boundary checkpoints under ``checkpoint_every`` (owned by
    :meth:`~.turns.Turns.save_boundary`; the coordinator waits for ``write``)."""

    # The checkpoint write of the boundary that ended the run's current turn.
    write: concurrent.futures.Future | None = None
    # Its boundaries since the last durable one that were not written, and its compute
    # seconds at that durable point: what the cadence decides on.
    volatile_chunks: int = 0
    durable_compute: float = 0.0


@dataclass
class WarmStart:
    """A warm clone's start, made by :mod:`.clones` and used up by its first turn."""

    # The parent's optimizer moments, given to the clone's optimizer once it exists.
    optimizer_state: list[dict[str, Any] | None] | None = None
    # Its starting values and moments, written for other workers to build it from.
    state_tree: dict[str, Any] | None = None
    # A gang clone's start: a copy of its parent's boundary checkpoint (weights and moments,
    # sharded or gathered as the parent's FSDP settings saved them), loaded in its first turn.
    checkpoint: Path | None = None


@dataclass
class Outcome:
    """What the run's training came to: its ``train()`` here (owned by
    :meth:`~.turns.Turns.run_main` and :meth:`RunSlot.record_error`), or its files when
    another worker finished it (:mod:`.catch_up`)."""

    finished: bool = False
    error: str | None = None
    error_traceback: str | None = None
    exception: BaseException | None = None  # what the run raised, in this process
    train_output: Any = None
    # The run's trainer state as last written to disk by whoever trained it (for results).
    disk_state: Any = None
    # Set when the run's turn met a disk fault (see faults.py): the experiment stops.
    fault: str | None = None


@dataclass
class RunSlot:
    """The engine's live record of one run: what it is (fixed when it is built: its knobs,
    trainer, model, plan and folders), its record in the shared state, and one record per
    owner for the rest (:class:`TurnState`, :class:`Durability`, :class:`WarmStart`,
    :class:`Outcome`)."""

    name: str
    index: int
    knobs: dict[str, Any]
    trainer: RunTrainer | None
    group: ModelGroup | None
    adapter: str | None
    residency: Residency
    plan: ChunkPlan  # replaced when the run's epochs change (see ChunkCallback)
    run_dir: Path
    evaluation: EvalCadence = EvalCadence.NONE
    chunk_save: bool = False
    step_multiple: int = 1
    num_chunks: int = 1  # asked for: the plan may have fewer (see chunks.plan_chunks)
    state: RunState = field(default=None)  # type: ignore[assignment]
    gang: int = 0  # > 0: trained by this many workers together (an FSDP run); 0: by one
    # Where its final weights go (``runs/<run>/final``; ``run_dir`` is its TRL output_dir,
    # the experiment's own output_dir when the experiment has one config, as in plain TRL).
    final_dir: Path = None  # type: ignore[assignment]
    # Where the run's boundary checkpoints go (``<output_dir>/.rapidfire/checkpoints/<run>``).
    checkpoints: Path | None = None
    # The result of the last op applied to this run in this session (written by the ops).
    last_op: str | None = None
    # Registered without its trainer (a PlannedRun): built when it is first scheduled.
    planned: bool = False
    turn: TurnState = field(default_factory=TurnState)
    durability: Durability = field(default_factory=Durability)
    warm: WarmStart = field(default_factory=WarmStart)
    outcome: Outcome = field(default_factory=Outcome)

    def __post_init__(self) -> None:
        if self.final_dir is None:
            self.final_dir = self.run_dir / "final"
        if self.state is None:
            self.state = RunState(name=self.name, knobs=dict(self.knobs))

    @property
    def failure(self) -> str:
        """Why the run failed, in one line (its own error, else the shared state's)."""
        return self.outcome.error or self.state.error or "failed"

    def model_group(self) -> ModelGroup:
        """The run's model group: every run that trains has one (a run that failed before
        its trainer was built has none)."""
        if self.group is None:
            raise RuntimeError(f"{self.name} has no model: "
                               + ("it is built when first scheduled" if self.planned
                                  else "it failed before training"))
        return self.group

    def record_error(self, exc: BaseException) -> None:
        """Keep why the run failed: one line for tags, warnings and tables, and the whole
        traceback for the log."""
        self.outcome.exception = exc
        self.outcome.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.outcome.error_traceback = "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__))

    def json_knobs(self) -> dict[str, Any]:
        """Its knobs as the shared state keeps them: JSON, so a LoRA config or a function is
        kept as its description."""
        return {k: v if isinstance(v, (str, int, float, bool, type(None))) else describe_value(v)
                for k, v in self.knobs.items()}

    def continues_from_disk(self) -> bool:
        """Whether the run's next chunk starts from its files: the shared state has chunks
        done that this worker's live ``train()`` did not do (another worker, an earlier
        process), or this worker holds no ``train()`` of a run that has chunks done."""
        done, turn = self.state.chunks_done, self.turn
        return done > turn.local_chunks or bool(
            done and turn.coroutine is None and turn.resume_from is None)

    def latest_trainer_state(self) -> Any:
        """The run's trainer state that is further along: its live trainer's, or the one
        last written to disk by whoever trained it (another worker, an earlier process) when
        that has more steps; ``None`` when it has neither."""
        live = self.trainer.state if self.trainer is not None else None
        disk = self.outcome.disk_state
        if disk is not None and (live is None or disk.global_step > live.global_step):
            return disk
        return live

    def train_output(self) -> Any:
        """The run's ``TrainOutput``: what its ``train()`` returned in this process, or one
        rebuilt from its trainer state: its step, its training loss and its latest metrics.
        The loss is the Trainer's own ``train_loss`` where its log holds one (a run that
        completed in an earlier process: a re-run of a finished script), else, for a run
        that did not finish (stopped), the mean of its logged training losses (the Trainer's
        ``training_loss`` is the mean over its steps). ``None`` before it has a trainer
        state."""
        if self.outcome.train_output is not None:
            return self.outcome.train_output
        state = self.latest_trainer_state()
        if state is None:
            return None
        from transformers.trainer_utils import TrainOutput

        history = state.log_history
        finals = [e["train_loss"] for e in history if isinstance(e.get("train_loss"), (int, float))]
        losses = [e["loss"] for e in history if isinstance(e.get("loss"), (int, float))]
        loss = finals[-1] if finals else sum(losses) / len(losses) if losses else 0.0
        return TrainOutput(int(state.global_step), loss, latest_metrics(history))

    def live_trainer(self) -> RunTrainer:
        """The run's trainer: every run that trains has one (a run that failed before its
        trainer was built has none)."""
        if self.trainer is None:
            raise RuntimeError(f"{self.name} has no trainer: "
                               + ("it is built when first scheduled" if self.planned
                                  else "it failed before training"))
        return self.trainer

    def result(self) -> RunResult:
        """What ``train()`` reports of the run (:class:`RunResult`)."""
        state = self.latest_trainer_state()
        if state is None:  # failed before its trainer existed, or not built yet
            return RunResult(self.name, dict(self.knobs), self.state.status,
                             self.state.global_step, str(self.final_dir.parent), {},
                             self.outcome.error or self.state.error)
        metrics = latest_metrics(state.log_history)
        if self.outcome.train_output is not None:
            metrics.update(
                {k: v for k, v in (self.outcome.train_output.metrics or {}).items()
                 if isinstance(v, (int, float))}
            )
        return RunResult(
            name=self.name,
            knobs=dict(self.knobs),
            status=self.state.status,
            global_step=int(state.global_step),
            # Its folder, where final/ is (the one config of an experiment trains in the
            # experiment's output_dir, as plain TRL would, and keeps final/ in runs/<run>).
            output_dir=str(self.final_dir.parent),
            metrics=metrics,
            error=self.outcome.error or self.state.error,
            last_op=self.last_op,
        )


def history_of(slot: RunSlot, chunks_done: int, *, training: bool = False) -> RunHistory:
    """What a policy or a search knows of ``slot``: its status, ``chunks_done`` (which may
    count a chunk trained here but not recorded yet), its plan and its logged entries (from
    its live trainer, or from its checkpoint when that is further along)."""
    state = slot.latest_trainer_state()
    return RunHistory(
        name=slot.name, status=slot.state.status, chunks_done=chunks_done,
        chunks_total=len(slot.plan), chunk_ends=tuple(c.end_step for c in slot.plan.chunks),
        log=tuple(state.log_history) if state is not None else (), knobs=slot.knobs,
        parent=slot.state.parent, training=training,
    )


@dataclass(eq=False)
class PendingChunk:
    """A chunk trained here, not yet recorded in the shared state.

    ``committed`` resolves once the background writer has written the chunk's checkpoint and
    recorded the chunk (or what stopped it) in the shared state, in a transaction of its own,
    fsync'd: that cost stays off the switch path. ``None``: no checkpoint is written (the
    boundary is volatile, see :mod:`trl_rapidfire.config.cadence`, or durability is off); the next
    claim records it."""

    slot: RunSlot
    record: ChunkRecord
    complete: bool  # the run's train() ended with this chunk
    chunks_total: int  # the run's plan as of this chunk
    committed: concurrent.futures.Future | None = None
    durable: bool = False  # its checkpoint is written (or complete: its final weights)
    # What recording did (None: not recorded yet).
    outcome: Recording | None = None


@dataclass(frozen=True)
class Recorded:
    """The chunk is recorded as done; the run has ``chunks_done`` chunks done."""

    chunks_done: int


@dataclass(frozen=True)
class ClaimLost:
    """The worker's claim on the chunk had expired: another worker trains it again."""


@dataclass(frozen=True)
class DiskFault:
    """Its checkpoint met a disk fault (``message``): released, the experiment stops."""

    message: str


@dataclass(frozen=True)
class WriteFailed:
    """Its checkpoint could not be written for another reason: the run failed (``error``)."""

    error: str


@dataclass(frozen=True)
class StateUnwritable:
    """The shared state's transaction raised ``exception``: raised in the loop, as if
    there."""

    exception: BaseException


# What recording a pending chunk in the shared state came to.
Recording = Recorded | ClaimLost | DiskFault | WriteFailed | StateUnwritable

# A run's checkpoint handed to the writer thread at the boundary after ``chunks`` chunks
# (step ``step``): (the run, the write, chunks, step). Its chunks are durable once it is done.
Written = tuple[RunSlot, concurrent.futures.Future, int, int]
