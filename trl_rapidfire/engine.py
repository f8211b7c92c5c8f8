"""The chunk engine: trains many runs in one process, one chunk at a time, each exactly as if
it were trained alone.

Each run is a live Trainer whose ``train()`` runs in a coroutine of its own (see
:mod:`trl_rapidfire.switch`). The engine's loop repeats:

1. ask the scheduler (:func:`~trl_rapidfire.scheduler.pick_next`) which run goes next;
2. *switch in*: park the previous run's tensors in the state cache and unpark this run's
   (:mod:`trl_rapidfire.residency`), activate its adapter, give it back its RNG streams and
   accelerate state;
3. resume its coroutine; its :class:`ChunkCallback` suspends it at the next chunk boundary
   (or the run ends, or fails);
4. *switch out*: save its RNG streams and accelerate state, record the chunk in the schedule.

Which run goes next is claimed from the experiment's shared state (:mod:`trl_rapidfire.store`),
so the same loop is one worker among several under ``accelerate launch``: each (run, chunk)
is claimed by exactly one worker. At every chunk boundary the run writes an ordinary HF
checkpoint (:mod:`trl_rapidfire.durable`) before the chunk counts as done. A run whose last
chunk this worker trained continues in its suspended ``train()`` (the fast path); any other
run, one trained by another worker or before a crash, is rebuilt and continues with the
Trainer's own ``train(resume_from_checkpoint=...)``.

The engine knows nothing of SFT, DPO or GRPO: the trainer layer builds each run's Trainer and
registers it with :meth:`Engine.add_run`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import gc
import json
import math
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from .accelerate_state import restore_accelerate_state, snapshot_accelerate_state
from .cache import StateCache, save_tree
from .chunks import ChunkPlan, plan_chunks, training_steps
from .control import Op, OpError, OpRecord, append_op_row, parse_op
from .durable import (
    checkpoint_at,
    prune_checkpoints,
    run_state_from_checkpoint,
    write_atomically,
    write_atomically_together,
)
from .faults import ExperimentFault, disk_fault, fault_message
from .knobs import describe_value
from .models import ModelGroup, ModelPool
from .policies import Context, Policy, RunHistory
from .progress import ExperimentProgress
from .residency import Residency
from .results import RunResult, latest_metrics
from .runs import RunState, RunStatus
from .schedule import ChunkRecord, append_schedule_row, read_schedule_csv, write_schedule_csv
from .store import (
    FileStore,
    choose,
    claim_next,
    disband_forming_gang,
    expire,
    fail_claimed,
    finish_chunk,
    finish_gang_chunk,
    gang_ready,
    release,
    renew,
)
from .switch import Aborted, RngState, RunCoroutine
from .tracking import PROGRESS_TAG, STATUS_TAG, Tracker
from .trust import check_run_name, inside
from .workers import WorkerInfo, current_worker, launcher_gone

__all__ = ["ChunkCallback", "Engine", "EngineStats", "RunSlot", "RunFailure"]


class RunFailure(RuntimeError):
    """Every run of the experiment failed; the message lists each run's error."""


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

    @property
    def switching(self) -> float:
        return max(self.wall - self.compute, 0.0)


@dataclass
class RunSlot:
    """The engine's live record of one run (the trainer and everything it must not lose)."""

    name: str
    index: int
    knobs: dict[str, Any]
    trainer: Any
    group: ModelGroup
    adapter: str | None
    residency: Residency
    plan: ChunkPlan
    run_dir: Path
    chunk_eval: bool = False
    chunk_save: bool = False
    step_multiple: int = 1
    state: RunState = field(default=None)  # type: ignore[assignment]
    rng: RngState | None = None
    accelerate: list[dict[str, Any]] | None = None
    coroutine: RunCoroutine | None = None
    finished: bool = False
    error: str | None = None
    last_op: str | None = None  # result of the last op applied to this run (this session)
    gang: int = 0  # > 0: trained by this many workers together (an FSDP run); 0: by one
    error_traceback: str | None = None
    train_output: Any = None
    compute_seconds: float = 0.0
    _resumed_at: float = 0.0
    _yielded_at: set[int] = field(default_factory=set)
    _eval_rng: RngState | None = None
    _points: list[tuple[str, float, int, int]] = field(default_factory=list)
    # Objects the run shares with others that keep state (e.g. a stateful reward function):
    # each has state_dict()/load_state_dict(); the run's own state is put back at every turn.
    stateful: list[Any] = field(default_factory=list)
    _stateful_states: list[Any] = field(default_factory=list)
    warm_optimizer_state: list[dict[str, Any] | None] | None = None
    # A warm clone's starting values and moments, written for other workers to build it from.
    warm_state_tree: dict[str, Any] | None = None
    # A gang clone's start: a copy of its parent's boundary checkpoint (weights and moments,
    # sharded or gathered as the parent's FSDP settings saved them), loaded in its first turn.
    warm_checkpoint: Path | None = None
    # Where the run's boundary checkpoints go (``<output_dir>/.rapidfire/checkpoints/<run>``).
    checkpoints: Path | None = None
    # Chunks this worker's live train() has done: behind the shared state's count, the run
    # was trained elsewhere (another worker, an earlier process) and continues from disk.
    local_chunks: int = 0
    # The checkpoint the next train() call resumes from, and whether the run's parameters
    # must be given room for it first.
    resume_from: Path | None = None
    needs_load: bool = False
    # Finished elsewhere: the final weights are on disk, loaded when the run is activated.
    weights_on_disk: bool = False
    # The run's trainer state as last written to disk by whoever trained it (for results).
    disk_state: Any = None
    _epoch_end_rng: tuple[int, RngState] | None = None
    # The checkpoint write of the boundary that ended the run's current turn.
    write: Any = None
    # Set when the run's turn met a disk fault (see faults.py): the experiment stops.
    fault: str | None = None

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = RunState(name=self.name, knobs=dict(self.knobs))

    @property
    def final_dir(self) -> Path:
        return self.run_dir / "final"

    def result(self) -> RunResult:
        if self.trainer is None:  # failed before its trainer existed
            return RunResult(self.name, dict(self.knobs), self.state.status, 0,
                             str(self.run_dir), {}, self.error or self.state.error)
        state = self.trainer.state
        if self.disk_state is not None and self.disk_state.global_step > state.global_step:
            state = self.disk_state
        metrics = latest_metrics(state.log_history)
        if self.train_output is not None:
            metrics.update(
                {k: v for k, v in (self.train_output.metrics or {}).items()
                 if isinstance(v, (int, float))}
            )
        return RunResult(
            name=self.name,
            knobs=dict(self.knobs),
            status=self.state.status,
            global_step=int(state.global_step),
            output_dir=str(self.run_dir),
            metrics=metrics,
            error=self.error or self.state.error,
            last_op=self.last_op,
        )


class ChunkCallback(TrainerCallback):
    """Added to every run's trainer: ends the run's turn at each chunk boundary.

    The turn ends at the first ``on_step_begin`` after a boundary, so everything the boundary
    step triggers (logging, evaluation, checkpoints, epoch-end work) happens in the run's own
    turn. A chunk boundary is not an epoch end: the callback never touches epoch control.
    """

    def __init__(self, engine: Engine, slot: RunSlot) -> None:
        self.engine = engine
        self.slot = slot

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        slot = self.slot
        if slot.warm_optimizer_state is not None:
            self.engine.load_warm_optimizer_state(slot)
        if slot.warm_checkpoint is not None:
            if state.global_step == 0:
                slot.trainer._rf_warm_start_from(slot.warm_checkpoint)
            slot.warm_checkpoint = None
        if train_dataloader is not None and hasattr(train_dataloader, "__len__"):
            # The dataloader the Trainer built is the truth (GRPO repeats every generation
            # batch, a sampler may drop batches): plan from it before the first step.
            plan = self.engine.plan_for(
                slot.name, len(train_dataloader), args, total_steps=state.max_steps,
                step_multiple=slot.step_multiple,
            )
            if plan != slot.plan:
                slot.plan = plan
                self.engine.replanned()

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Kept in memory; the engine hands a chunk's points to the tracker when the chunk ends.
        now = int(time.time() * 1000)
        step = int(state.global_step)
        for key, value in (logs or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.slot._points.append((key, float(value), step, now))

    def on_epoch_end(self, args, state, control, **kwargs):
        if state.global_step in self.slot.plan.boundaries:
            # On resume the Trainer puts the random streams back *before* the next epoch
            # shuffles its data: a boundary at an epoch end records them as of now.
            self.slot._epoch_end_rng = (state.global_step, RngState.capture())

    def on_step_begin(self, args, state, control, **kwargs):
        slot = self.slot
        step = state.global_step
        if step in slot.plan.boundaries and step not in slot._yielded_at:
            slot._yielded_at.add(step)
            # Here the next step's batches are fetched and nothing else has moved: exactly
            # where train(resume_from_checkpoint=...) restores a mid-epoch checkpoint.
            self.engine.save_boundary(slot)
            self.engine.end_turn(slot)

    def on_step_end(self, args, state, control, **kwargs):
        slot = self.slot
        if state.global_step in slot.plan.boundaries:
            if slot.chunk_eval:
                control.should_evaluate = True
                # Evaluation must not move the run's random streams.
                slot._eval_rng = RngState.capture()
            if slot.chunk_save:
                control.should_save = True

    def on_evaluate(self, args, state, control, **kwargs):
        if self.slot._eval_rng is not None:
            self.slot._eval_rng.restore()
            self.slot._eval_rng = None


class Engine:
    """Runs the registered runs chunk by chunk until each is completed or failed.

    Args:
        output_dir: the experiment folder (``schedule.csv`` and ``runs/<name>/`` go here).
        cache: where parked run state lives.
        progress: show the progress bar and the runs table at chunk boundaries.
        store: the experiment's shared scheduler state (default: a file store in
            ``<output_dir>/.rapidfire`` for this process alone).
        worker: who this worker is (default: this process, see :mod:`trl_rapidfire.workers`).
        pool: the shared base models (moved on and off a CUDA device as runs take turns).
        durable: write each run's checkpoint at every chunk boundary (what crash recovery
            and moving runs between workers rest on).
        lease_seconds: how long a claim lives without renewal (the worker renews it while it
            trains; on this machine a dead worker is noticed at once, whatever the lease).
    """

    def __init__(
        self,
        output_dir: str | Path,
        cache: StateCache,
        *,
        progress: bool = True,
        store: FileStore | None = None,
        worker: WorkerInfo | None = None,
        pool: ModelPool | None = None,
        durable: bool = True,
        lease_seconds: float = 120.0,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.cache = cache
        self.worker = worker or current_worker()
        self.store = store or FileStore(self.output_dir / ".rapidfire", fingerprint="")
        self.pool = pool
        self.durable = durable
        self.lease_seconds = lease_seconds
        self.idle_wait = 0.05
        self.tracker: Tracker | None = None
        self.op_log: list[OpRecord] = []
        # Set by the trainer layer: how to build a clone's run, and a fresh trainer for a run
        # that continues from its checkpoint.
        self.clone_builder: Callable[..., RunSlot] | None = None
        self.rebuild: Callable[[RunSlot], Any] | None = None
        # (source, run, op text, reason): "python", "tag" or "policy:<name>".
        self._queued_ops: list[tuple[str, str, str, str | None]] = []
        # (run, op) the script itself asked for: a clone recipe in the shared state that
        # matches one may be rebuilt with the author's rights.
        self._author_ops: set[tuple[str, str]] = set()
        # Ops may be queued from another thread (a notebook while train(blocking=False) runs).
        self._ops_lock = threading.Lock()
        # Automatic control (see policies.py), asked by the first worker at every chunk end.
        self.policy: Policy | None = None
        self._policy_seen: dict[str, int] = {}
        self._training_elsewhere: set[str] = set()  # runs other workers are training now
        self._wall_before = 0.0  # training wall time of earlier sessions
        self._train_calls = 0  # run() calls so far (the same in every worker of a launch)
        self.gang_wait_seconds = 1800.0  # longest wait for a gang's members to join
        self._run_started: float | None = None
        self.slots: dict[str, RunSlot] = {}
        self.schedule: list[ChunkRecord] = []
        self.stats = EngineStats()
        self.interrupted = False
        self._progress_enabled = progress
        self._progress: ExperimentProgress | None = None
        self._resident: RunSlot | None = None
        self._claimed: tuple[str, int] | None = None
        # Chunks trained but not yet recorded: (run, its checkpoint write, the chunk).
        self._pending_finishes: list[tuple[RunSlot, Any, ChunkRecord]] = []
        # One thread writes boundary checkpoints while the next run trains.
        self._writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rapidfire-checkpoint"
        )
        self._registered = False
        # A disk fault stopped the experiment (faults.py): this engine trains no more; a
        # re-run of the script continues from the last recorded boundaries.
        self._fault: str | None = None

    @property
    def checkpoint_root(self) -> Path:
        return self.output_dir / ".rapidfire" / "checkpoints"

    @property
    def schedule_path(self) -> Path:
        return self.output_dir / "schedule.csv"

    # ------------------------------------------------------------------ building

    @staticmethod
    def plan_for(
        name: str, num_batches: int, args: Any, *, total_steps: int | None = None,
        step_multiple: int = 1,
    ) -> ChunkPlan:
        """The chunk plan of a run whose dataloader has ``num_batches`` batches per epoch."""
        num_chunks = getattr(args, "_rf_num_chunks", 1)
        spe, total = training_steps(
            num_batches, args.gradient_accumulation_steps, args.num_train_epochs, args.max_steps
        )
        with warnings.catch_warnings():
            # Said once, when the run is registered; the re-plan from the real dataloader
            # must not repeat it.
            if total_steps is not None:
                warnings.simplefilter("ignore", UserWarning)
            return plan_chunks(spe, total_steps or total, num_chunks, run=name,
                               step_multiple=step_multiple)

    def add_run(
        self,
        *,
        name: str,
        index: int,
        knobs: dict[str, Any],
        trainer: Any,
        group: ModelGroup,
        adapter: str | None,
        params: Sequence[torch.nn.Parameter],
        num_chunks: int,
        run_dir: Path,
        chunk_eval: bool = False,
        chunk_save: bool = False,
        gang: int = 0,
    ) -> RunSlot:
        """Register a freshly built trainer as a run (``gang``: trained by that many workers
        together, e.g. FSDP; its trainer was built in the launch's world).

        Call right after building the trainer: its RNG streams and accelerate's state are
        captured now, as the run's starting point (what they would be in a script that built
        this trainer alone and then called ``train()``).
        """
        check_run_name(name)
        inside(self.output_dir, run_dir)  # names come from files too: never outside
        inside(self.output_dir, self.checkpoint_root / name)
        args = trainer.args
        args._rf_num_chunks = num_chunks
        dataset = trainer.train_dataset
        if hasattr(trainer, "_rf_num_batches"):
            num_batches = trainer._rf_num_batches()
        elif hasattr(dataset, "__len__"):
            batch = args.per_device_train_batch_size
            n = len(dataset)
            num_batches = n // batch if args.dataloader_drop_last else math.ceil(n / batch)
        else:
            num_batches = max(args.max_steps, 1) * args.gradient_accumulation_steps
        if gang > 1 and args.max_steps <= 0:
            # Each member sees its shard of the batches (accelerate's even split); the plan
            # must be right before train() starts, for a run continued from its checkpoint.
            num_batches = (num_batches // gang if args.dataloader_drop_last
                           else math.ceil(num_batches / gang))
        step_multiple = getattr(trainer, "_rf_step_multiple", lambda: 1)()
        plan = self.plan_for(name, num_batches, args, step_multiple=step_multiple)
        slot = RunSlot(
            name=name,
            index=index,
            knobs=knobs,
            trainer=trainer,
            group=group,
            adapter=adapter,
            residency=Residency(key=name, params=list(params)),
            plan=plan,
            run_dir=Path(run_dir),
            chunk_eval=chunk_eval,
            chunk_save=chunk_save,
            step_multiple=step_multiple,
            checkpoints=self.checkpoint_root / name,
            gang=gang,
        )
        if gang:
            # Its own model (sharded by its trainer) stays where it is: nothing to park.
            slot.residency.resident = False
        self._attach(slot, trainer)
        self.slots[name] = slot
        return slot

    def _attach(self, slot: RunSlot, trainer: Any) -> None:
        # The trainer's starting point: RNG streams and accelerate state as they are right
        # after it was built, what a script that built it alone would then train from.
        slot.trainer = trainer
        trainer.add_callback(ChunkCallback(self, slot))
        slot.stateful = list(getattr(trainer, "_rf_stateful", lambda: [])())
        slot._stateful_states = [copy.deepcopy(obj.state_dict()) for obj in slot.stateful]
        slot.rng = RngState.capture()
        slot.accelerate = snapshot_accelerate_state()

    def add_failed_run(
        self, *, name: str, index: int, knobs: dict[str, Any], run_dir: Path,
        group: ModelGroup | None, error: BaseException,
    ) -> RunSlot:
        """Register a run whose trainer could not be built (e.g. its formatting function
        raised while the dataset was prepared): it is failed from the start, the others go on."""
        slot = RunSlot(
            name=name, index=index, knobs=knobs, trainer=None, group=group, adapter=None,
            residency=Residency(key=name, params=[]), plan=ChunkPlan(0, 0, 0, ()),
            run_dir=Path(run_dir), finished=True,
        )
        slot.error = "".join(traceback.format_exception_only(type(error), error)).strip()
        slot.error_traceback = "".join(
            traceback.format_exception(type(error), error, error.__traceback__)
        )
        slot.state.fail(slot.error)
        self.slots[name] = slot
        warnings.warn(f"{name} failed before training: {slot.error}", RuntimeWarning, stacklevel=2)
        return slot

    def replanned(self) -> None:
        if self._progress is not None:
            self._progress.set_total(self.total_chunks)

    @property
    def total_chunks(self) -> int:
        return sum(len(s.plan) for s in self.slots.values())

    def results(self) -> list[RunResult]:
        # A copy of the slots: a clone may be added meanwhile by a training thread.
        return [s.result() for s in list(self.slots.values())]

    # ------------------------------------------------------------------ run side

    def end_turn(self, slot: RunSlot) -> None:
        """Called inside the run's coroutine at a chunk boundary: suspend until resumed."""
        slot.compute_seconds += time.perf_counter() - slot._resumed_at
        slot.coroutine.suspend()
        slot._resumed_at = time.perf_counter()

    def save_boundary(self, slot: RunSlot) -> None:
        """Inside the run's turn, at a chunk boundary: write its checkpoint (atomically).
        The chunk counts as done only after this."""
        if not self.durable or slot.checkpoints is None:
            return
        step = int(slot.trainer.state.global_step)
        rng = None
        if slot._epoch_end_rng is not None and slot._epoch_end_rng[0] == step:
            rng = slot._epoch_end_rng[1]
        slot._epoch_end_rng = None
        target = slot.checkpoints / f"checkpoint-{step}"
        if slot.gang:
            # Written now, by every member together (collectives); only the first prunes.
            with _disk_faults("the checkpoint", target):
                slot.trainer._rf_save_gang_boundary(target, rng)
            if self.worker.rank == 0:
                prune_checkpoints(slot.checkpoints, keep=(
                    target, slot.checkpoints / f"checkpoint-{slot.state.global_step}"))
            slot.write = None
            return
        with _disk_faults("the checkpoint", target):
            finish = slot.trainer._rf_save_boundary(target, rng)
        # The checkpoint of the last boundary the shared state has recorded stays until this
        # one is recorded too (a crash in between resumes from it); older ones go.
        keep = (target, slot.checkpoints / f"checkpoint-{slot.state.global_step}")
        folder = slot.checkpoints

        def write() -> None:
            with _disk_faults("the checkpoint", target):
                finish()
                prune_checkpoints(folder, keep=keep)

        # Written while the next run trains; the chunk is recorded as done only after.
        slot.write = self._writer.submit(write)

    def _write_final(self, slot: RunSlot) -> None:
        trainer = slot.trainer
        inside(self.output_dir, slot.final_dir)

        def write(folder: Path) -> None:
            trainer.save_model(str(folder))
            # What a worker that did not train the run needs to report it.
            trainer.state.save_to_json(str(folder / "trainer_state.json"))
            out = slot.train_output
            (folder / "train_output.json").write_text(json.dumps({
                "global_step": out.global_step, "training_loss": out.training_loss,
                "metrics": out.metrics,
            }, default=float), encoding="utf-8")

        with _disk_faults("the final weights", slot.final_dir):
            if slot.gang:
                write_atomically_together(slot.final_dir, write)
            else:
                write_atomically(slot.final_dir, write)

    def _run_main(self, slot: RunSlot) -> None:
        slot._resumed_at = time.perf_counter()
        try:
            kwargs = {}
            if slot.resume_from is not None:
                kwargs["resume_from_checkpoint"] = str(slot.resume_from)
            slot.train_output = slot.trainer.train(**kwargs)
            self._write_final(slot)
        except Aborted:
            pass
        except Exception as exc:  # a run's failure must not stop the others
            detail = disk_fault(exc)
            if detail is not None:  # not the run's doing: the experiment stops instead
                slot.fault = str(exc) if isinstance(exc, ExperimentFault) else fault_message(
                    "the run's files", slot.run_dir, detail)
                return
            slot.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            slot.error_traceback = traceback.format_exc()
        finally:
            # KeyboardInterrupt and SystemExit pass through to the scheduler, which stops.
            slot.finished = True
            slot.compute_seconds += time.perf_counter() - slot._resumed_at

    # ------------------------------------------------------------------ shared state

    def _register(self) -> None:
        """First ``run()``: put this process's runs in the shared state, or take the state
        that an earlier process (a killed experiment) or another worker left."""
        with self.store.transaction() as st:
            for slot in self.slots.values():
                if slot.gang:
                    st.gang_size[slot.name] = slot.gang
                if slot.name not in st.runs:
                    st.add_run(slot.name, len(slot.plan), _json_knobs(slot.knobs))
                    if slot.trainer is None:
                        st.runs[slot.name].fail(slot.error or "could not be set up")
            expire(st, now=time.time())
            # Claims this worker left behind (an earlier trainer in this process that stopped
            # for a disk fault could not write their release): nobody is training them.
            for name in [n for n, c in st.claims.items() if c.worker == self.worker.id]:
                release(st, name, self.worker.id)
            records = {n: r.copy() for n, r in st.runs.items()}
            clones = self._unbuilt_clones(st)
            # Rows are appended under the same lock. Rewriting what is there drops a line a
            # crash cut short, so the next row starts on a line of its own.
            if self.schedule_path.exists():
                self.schedule = read_schedule_csv(self.schedule_path)
            write_schedule_csv(self.schedule, self.schedule_path)
        for name, info in clones.items():
            self._build_clone_from_store(name, info)
        for name, record in records.items():
            if name in self.slots:
                self._adopt(self.slots[name], record)
                slot = self.slots[name]
                if record.chunks_done and self.tracker is not None and self.worker.rank == 0:
                    # Points of chunks that reached disk but not MLflow (a crash in between)
                    # are in the checkpoint's log history; MLflow keeps one point per step.
                    state = slot.disk_state
                    if state is not None:
                        self.tracker.log_metrics(name, _points_of(state.log_history))
                    self._report(slot)
        self._registered = True

    def _adopt(self, slot: RunSlot, record: RunState) -> None:
        """Make this worker's view of ``slot`` the shared state's ``record``."""
        before = slot.state
        slot.state = record
        if record.status == RunStatus.DELETED and before.status != RunStatus.DELETED:
            self._forget(slot)
            return
        if record.status == RunStatus.FAILED and slot.error is None:
            slot.error = record.error
        behind = record.chunks_done > slot.local_chunks
        if not behind:
            return
        if record.status == RunStatus.COMPLETED:
            final = slot.final_dir
            if (final / "trainer_state.json").is_file() and not slot.weights_on_disk:
                slot.disk_state = _load_trainer_state(final / "trainer_state.json")
                out = json.loads((final / "train_output.json").read_text("utf-8"))
                from transformers.trainer_utils import TrainOutput

                slot.train_output = TrainOutput(out["global_step"], out["training_loss"],
                                                out["metrics"])
                slot.weights_on_disk = True
        elif slot.checkpoints is not None and record.global_step != getattr(
            slot.disk_state, "global_step", None
        ):
            ckpt = checkpoint_at(slot.checkpoints, record.global_step)
            if ckpt is not None:
                slot.disk_state = _load_trainer_state(ckpt / "trainer_state.json")

    def _sync(self, st: Any) -> None:
        self._training_elsewhere = {n for n, c in st.claims.items() if c.worker != self.worker.id}
        if self.worker.rank == 0 and self._run_started is not None:
            st.wall_seconds = self._wall_seconds()
        for name, record in st.runs.items():
            slot = self.slots.get(name)
            if slot is not None:
                self._adopt(slot, record.copy())

    def _forget(self, slot: RunSlot) -> None:
        if slot.coroutine is not None and not slot.coroutine.finished:
            slot.coroutine.abort()
        slot.residency.drop(self.cache)
        if self._resident is slot:
            self._resident = None

    def _claim(self) -> tuple[RunSlot, int] | None | bool | object:
        """Claim the next (run, chunk): the slot and chunk, ``None`` to wait (others are
        training runs that may come back), ``False`` when nothing is left, ``_RETRY`` to claim
        again at once."""
        finished: list[RunSlot] = []
        claimed = write = None
        with self.store.transaction(durable=bool(self._pending_finishes)) as st:
            if self._pending_finishes:
                finished = self._record_finishes(st)
            clones = self._unbuilt_clones(st)
            # Under a launch nothing trains before the first worker has applied the ops its
            # script queued before train() (e.g. a stop).
            # Per train() call: a script that stops, resumes and trains again queues ops
            # before each call, and every worker makes the same calls.
            token = f"{self.worker.launch}#{self._train_calls}"
            held = self.worker.launched and st.ready != token
            if held and self.worker.rank == 0:
                st.ready, held = token, False
            writing = {slot.name: w for slot, w, _ in self._pending_finishes}
            if not clones and not held and writing:
                # A run whose checkpoint is still being written stays claimed by this worker;
                # if it is the one to train next, wait for its write instead of moving on.
                write = writing.get(choose(st, self.worker.id, finishing=writing))
            if not clones and not held and write is None:
                claimed = claim_next(st, self.worker.id, now=time.time(),
                                     lease_seconds=self.lease_seconds)
            waiting = st.live_claims()
            self._sync(st)
        for slot in finished:
            self._after_turn(slot)
        if clones:  # made by another worker: build them here too
            for name, info in clones.items():
                self._build_clone_from_store(name, info)
            return _RETRY
        if write is not None:
            concurrent.futures.wait([write])
            return _RETRY
        if claimed is not None:
            self._claimed = claimed
            return self.slots[claimed[0]], claimed[1]
        return None if waiting or held else False

    def _unbuilt_clones(self, st: Any) -> dict[str, dict[str, str]]:
        return {n: dict(info) for n, info in st.clones.items() if n not in self.slots}

    def _build_clone_from_store(self, name: str, info: dict[str, str]) -> None:
        parent = self.slots.get(info["parent"])
        if parent is None or self.clone_builder is None:
            raise RuntimeError(f"cannot build clone {name}: parent {info['parent']} unknown")
        warm = self.warm_dir(name)
        # The state file is not the author: its recipe is held to a tag's limits, unless this
        # script asked for the same clone itself (every worker of a launch queues its ops).
        trusted = (info["parent"], info["op"]) in self._author_ops
        try:
            self.clone_builder(parent, parse_op(info["op"]), name=name,
                               warm_from=warm if warm.is_dir() else None, trusted=trusted)
        except OpError as err:
            # Not buildable here (e.g. a Python clone of another session that loads code):
            # that run fails alone, saying why; the others train on.
            self.add_failed_run(
                name=name, index=int(name.rsplit("-", 1)[1]), knobs={}, group=None,
                run_dir=self.output_dir / "runs" / name,
                error=OpError(f"cannot rebuild clone {name} of {info['parent']} from "
                              f"{self.store.path}: {err}"),
            )
            with self.store.transaction() as st:
                record = st.runs.get(name)
                if record is not None and record.status.schedulable:
                    record.fail(self.slots[name].error)
                self._sync(st)
        if self._progress is not None:
            self._progress.set_total(self.total_chunks)

    # ------------------------------------------------------------------ scheduler side

    def _switch_in(self, slot: RunSlot) -> None:
        prev = self._resident
        if prev is not None and prev is not slot and prev.residency.resident:
            prev.residency.park(self.cache, prev.trainer.optimizer)
        if slot.gang:
            # Its own model, sharded by its trainer, never leaves: nothing to bring back.
            self._resident = slot
            self._restore_run_state(slot)
            return
        if self.pool is not None:
            self.pool.make_room(slot.group, slot.trainer.args.device)
        if slot.needs_load:
            # Its values come from a checkpoint: only room for them is needed.
            slot.residency.materialize(self.cache)
            slot.needs_load = False
        elif not slot.residency.resident:
            if slot.residency.key in self.cache:
                slot.residency.unpark(self.cache, slot.trainer.optimizer)
            elif slot.group.initial_weights is not None:
                slot.residency.load_initial(slot.group.initial_weights)
            else:
                raise RuntimeError(f"{slot.name}: no state to restore.")
        self._resident = slot
        if slot.adapter is not None and slot.group.model.active_adapter != slot.adapter:
            slot.group.activate(slot.adapter)
        self._detach_idle(slot.group)
        self._restore_run_state(slot)

    def _restore_run_state(self, slot: RunSlot) -> None:
        restore_accelerate_state(slot.accelerate)
        for obj, state in zip(slot.stateful, slot._stateful_states):
            obj.load_state_dict(copy.deepcopy(state))
        slot.rng.restore()

    def _detach_idle(self, group: Any) -> None:
        """Runs out of the rotation (stopped, finished, failed, deleted) leave the shared
        model's module tree; their parameter objects stay with them (see
        ``ModelGroup.detach``). ``activate`` brings one back when it is needed."""
        for other in self.slots.values():
            if (other.group is group and other.adapter is not None
                    and not other.residency.resident and not other.state.status.schedulable):
                group.detach(other.adapter)

    def _switch_out(self, slot: RunSlot) -> None:
        slot.rng = RngState.capture()
        slot.accelerate = snapshot_accelerate_state()
        slot._stateful_states = [copy.deepcopy(obj.state_dict()) for obj in slot.stateful]

    def _continue_from_disk(self, slot: RunSlot) -> None:
        """The shared state is ahead of this worker's live train() of ``slot``: continue from
        the run's checkpoint at its last boundary, with a fresh trainer if this one ran."""
        done = slot.state.chunks_done
        if done == 0:
            # Only a claim lost in the first chunk (lease expired) leads here: the starting
            # weights this worker had are gone, and no checkpoint exists yet.
            raise RuntimeError(f"{slot.name} must restart from its first chunk, and its "
                               "starting weights are no longer in this worker")
        step = slot.plan.chunks[done - 1].end_step
        ckpt = checkpoint_at(slot.checkpoints, step) if slot.checkpoints else None
        if ckpt is None:
            raise RuntimeError(
                f"{slot.name} has {done} chunk(s) done but no checkpoint at step {step} in "
                f"{slot.checkpoints}; it cannot continue exactly."
            )
        if slot.coroutine is not None:
            if not slot.coroutine.finished:
                slot.coroutine.abort()
            slot.coroutine = None
            if self.rebuild is None:
                raise RuntimeError(f"{slot.name}: this experiment cannot rebuild a trainer")
            self._attach(slot, self.rebuild(slot))
        slot.resume_from = ckpt
        slot.needs_load = True
        slot.warm_optimizer_state = None  # a warm clone's start: its checkpoint supersedes it
        slot.warm_checkpoint = None
        slot._yielded_at = {step}
        slot.finished = False
        slot.local_chunks = done

    def _turn(self, slot: RunSlot, chunk_number: int) -> None:
        if slot.state.chunks_done > slot.local_chunks or (
            slot.state.chunks_done and slot.coroutine is None and slot.resume_from is None
        ):
            try:
                self._continue_from_disk(slot)
            except Exception as exc:  # noqa: BLE001 - this run fails, the others go on
                slot.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                slot.error_traceback = traceback.format_exc()
                self._claimed = None
                self._fail(slot)
                self._after_turn(slot)
                return
        if slot.gang and not self._wait_for_gang(slot):
            self._claimed = None  # a member is gone: the chunk will be trained again
            return
        chunk = slot.plan.chunks[chunk_number] if chunk_number < len(slot.plan) else None
        start_step = chunk.start_step if chunk is not None else slot.state.global_step
        self._switch_in(slot)
        if slot.coroutine is None:
            slot.coroutine = RunCoroutine(lambda: self._run_main(slot), name=slot.name)
        if self._progress is not None:
            self._progress.start(slot.name)
        t0 = time.time()
        if self.tracker is not None:
            self.tracker.active.set()  # MLflow work runs while the chunk computes...
        keeper = _LeaseKeeper(self, slot.name)
        try:
            slot.coroutine.resume()
        finally:
            keeper.stop()
            if self.tracker is not None:
                self.tracker.active.clear()  # ...and waits while the engine switches
        t1 = time.time()
        self._switch_out(slot)
        end_step = int(slot.trainer.state.global_step)
        self._claimed = None

        if slot.fault is not None:
            # Its train() is gone; the chunk is trained again, by a re-run, from the last
            # boundary on disk (kept until a newer one is recorded).
            self._fault = self._fault or slot.fault
            slot.fault, slot.coroutine = None, None
            with self.store.transaction() as st:
                release(st, slot.name, self.worker.id)
            return
        if slot.error is not None:
            self._fail(slot)
        elif slot.gang and (end_step > start_step or slot.finished):
            self._finish_gang_chunk(slot, ChunkRecord(
                run=slot.name, epoch=chunk.epoch if chunk else 0,
                chunk=chunk.index if chunk else 0, number=chunk_number,
                worker=self.worker.rank, start_time=t0, end_time=t1,
                start_step=start_step, end_step=end_step,
            ))
        elif end_step > start_step or slot.finished:
            # Recorded once its checkpoint is on disk, in the transaction of a later claim
            # (one lock and write per chunk, not two).
            write, slot.write = slot.write, None
            self._pending_finishes.append((slot, write, ChunkRecord(
                run=slot.name, epoch=chunk.epoch if chunk else 0,
                chunk=chunk.index if chunk else 0, number=chunk_number,
                worker=self.worker.rank, start_time=t0, end_time=t1,
                start_step=start_step, end_step=end_step,
            )))
            return
        else:
            with self.store.transaction() as st:
                release(st, slot.name, self.worker.id)
                self._sync(st)
        self._after_turn(slot)

    def _wait_for_gang(self, slot: RunSlot) -> bool:
        """Until every member of the gang has joined (they join as they finish the chunk
        they are training); ``False`` if the gang broke up (a member died) or could not form
        within ``gang_wait_seconds`` (then the run fails, saying why)."""
        deadline = time.time() + self.gang_wait_seconds
        while True:
            with self.store.transaction(durable=False) as st:
                expire(st, now=time.time())
                ready = gang_ready(st)
                if ready is None or st.gang["run"] != slot.name:
                    return False
                if not ready and time.time() > deadline:
                    joined = len(st.gang["members"])
                    release(st, slot.name, self.worker.id)
                    slot.error = (f"its gang of {slot.gang} workers did not form within "
                                  f"{self.gang_wait_seconds:g} s ({joined} joined): are all "
                                  "the launch's workers still in train()?")
                    st.runs[slot.name].fail(slot.error)
                    self._sync(st)
                    self._after_turn(slot)
                    return False
                renew(st, slot.name, self.worker.id, now=time.time(),
                      lease_seconds=self.lease_seconds)
            if ready:
                return True
            time.sleep(self.idle_wait)

    def _wait_for_gang_record(self) -> None:
        """If this worker has done its share of a gang chunk, wait until the chunk is
        recorded (by the last member): ops act on recorded boundaries."""
        if not any(slot.gang for slot in self.slots.values()):
            return
        while True:
            with self.store.transaction(durable=False) as st:
                expire(st, now=time.time())  # a member that died ends the gang
                if st.gang is None or self.worker.id not in st.gang["done"]:
                    self._sync(st)  # the chunk as the last member recorded it
                    return
            time.sleep(self.idle_wait)

    def _finish_gang_chunk(self, slot: RunSlot, record: ChunkRecord) -> None:
        """This member's share of the chunk (and of its checkpoint) is done: record it; the
        last member to get here records the chunk itself."""
        with self.store.transaction() as st:
            st.chunks_total[slot.name] = len(slot.plan)
            last = finish_gang_chunk(st, slot.name, self.worker.id, record.number,
                                     global_step=record.end_step, complete=slot.finished)
            if last:
                append_schedule_row(record, self.schedule_path)
            if last is not False:
                self.schedule.append(record)
                slot.local_chunks = record.number + 1 if not slot.finished else len(slot.plan)
            else:
                warnings.warn(f"{slot.name}: its gang broke up during chunk {record.number}; "
                              "the chunk is trained again.", RuntimeWarning, stacklevel=3)
                slot.local_chunks = -1
            self._sync(st)
        self._after_turn(slot)

    def _record_finishes(self, st: Any, *, wait: bool = False) -> list[RunSlot]:
        """Inside a transaction: record the chunks whose checkpoints are on disk (all of them,
        waiting for their writes, with ``wait``). A run whose write failed fails."""
        done, left = [], []
        for slot, write, record in self._pending_finishes:
            if write is not None and not write.done() and not wait:
                left.append((slot, write, record))
                continue
            error = write.exception() if write is not None else None
            if error is not None and disk_fault(error, ours=True) is not None:
                # The previous boundary stays on disk and recorded: a re-run trains the chunk
                # again from there. Nothing is failed.
                self._fault = self._fault or (str(error) if isinstance(error, ExperimentFault)
                                              else fault_message("the checkpoint", None,
                                                                 disk_fault(error, ours=True)))
                release(st, slot.name, self.worker.id)
                continue
            if error is not None:
                slot.error = f"writing its checkpoint failed: {type(error).__name__}: {error}"
                fail_claimed(st, slot.name, self.worker.id, slot.error)
                done.append(slot)
                continue
            st.chunks_total[slot.name] = len(slot.plan)
            ok = finish_chunk(st, slot.name, self.worker.id, record.number,
                              global_step=record.end_step, complete=slot.finished)
            if ok:
                append_schedule_row(record, self.schedule_path)
                self.schedule.append(record)
                slot.local_chunks = st.runs[slot.name].chunks_done
            else:
                warnings.warn(f"{slot.name}: this worker lost its claim on chunk "
                              f"{record.number} (lease expired); another worker redoes it.",
                              RuntimeWarning, stacklevel=3)
                slot.local_chunks = -1
            done.append(slot)
        self._pending_finishes = left
        return done

    def _after_turn(self, slot: RunSlot) -> None:
        if slot.error is not None and slot.state.status == RunStatus.FAILED:
            slot.residency.drop(self.cache)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # after an out-of-memory error, give the rest back
            if self._resident is slot:
                self._resident = None
            warnings.warn(f"{slot.name} failed: {slot.error}", RuntimeWarning, stacklevel=3)
        if slot.state.status == RunStatus.COMPLETED and slot.checkpoints is not None:
            inside(self.output_dir, slot.checkpoints)
            shutil.rmtree(slot.checkpoints, ignore_errors=True)
        self._report(slot)
        if self._progress is not None and self._progress.showing and slot.error is None:
            self._progress.chunk_done(self.results(), self._chunks_done())

    def _flush_finishes(self) -> None:
        self._wait_for_gang_record()
        if self._pending_finishes:
            with self.store.transaction() as st:
                slots = self._record_finishes(st, wait=True)
                self._sync(st)
            for slot in slots:
                self._after_turn(slot)

    def _wait_for_a_write(self) -> bool:
        """Block until the oldest pending checkpoint write ends; ``False`` if none is."""
        for _, write, _ in self._pending_finishes:
            if write is not None:
                concurrent.futures.wait([write])
                return True
        return bool(self._pending_finishes)

    def _chunks_done(self) -> int:
        return sum(min(s.state.chunks_done, len(s.plan)) for s in self.slots.values())

    def _fail(self, slot: RunSlot) -> None:
        """Record in the shared state that ``slot`` failed (``_after_turn`` lets it go)."""
        with self.store.transaction() as st:
            fail_claimed(st, slot.name, self.worker.id, slot.error)
            self._sync(st)

    def run(self) -> None:
        """Train every registered run to the end (or to its failure).

        With several workers (``accelerate launch``), returns when no run is left for any of
        them. The first Ctrl-C stops at the next chunk boundary (``interrupted`` is set, the
        finished chunks are on disk, a re-run continues); a second one stops at once.
        """
        if self._fault is not None:
            raise ExperimentFault(self._fault)
        # Under a launch the first worker shows the experiment's progress for all of them.
        self._progress = ExperimentProgress(
            self.total_chunks, enabled=self._progress_enabled and self.worker.rank == 0
        )
        # Every run's train() starts with accelerate's free_memory(), a full gc.collect() over
        # everything the process holds (~0.2 s per run with the HF stack imported). The models,
        # datasets and trainers built so far live as long as the experiment: freeze them out
        # of the collector's view for its duration.
        gc.collect()
        gc.freeze()
        if self.tracker is not None:
            # Only the first worker applies ops from tags: the others need not poll them.
            if self.worker.rank == 0:
                self.tracker.polling.set()
            else:
                self.tracker.polling.clear()
        started = self._run_started = time.perf_counter()
        self._train_calls += 1
        ok = False
        self.interrupted = False
        previous_handler = _install_sigint(self)
        try:
            self._loop()
            ok = self._fault is None
        except Exception as exc:
            detail = disk_fault(exc, ours=True) if isinstance(exc, OSError) else None
            if isinstance(exc, ExperimentFault) or detail is not None:
                self._fault = self._fault or (str(exc) if detail is None else
                                              fault_message("the experiment's files", None,
                                                            detail))
            else:
                raise
        finally:
            self._end_run_call(started, ok, previous_handler)
        if self._fault is not None:
            raise ExperimentFault(self._fault)

    def _loop(self) -> None:
        """The scheduler loop of one ``run()`` call."""
        if not self._registered:
            self._register()
        if self.worker.rank == 0:
            with self.store.transaction(durable=False) as st:
                self._wall_before = st.wall_seconds
        self._progress.set_done(self._chunks_done())
        while not self.interrupted and self._fault is None:
            if self.worker.launched and self._orphaned():
                break
            self._consult_policy()
            if self._ops_pending():
                # Ops act on runs as of their last trained chunk: record those first.
                self._flush_finishes()
                self.apply_ops()
            claimed = self._claim()
            if claimed is False:
                break
            if claimed is _RETRY:
                continue
            if claimed is None:
                # Waiting for our own checkpoint writes (their runs stay claimed until
                # recorded), else for other workers.
                if not self._wait_for_a_write():
                    time.sleep(self.idle_wait)
                continue
            self._turn(*claimed)

    def _orphaned(self) -> bool:
        """Whether this worker's launcher died (killed alone): its workers stop at this
        boundary, so a re-run never shares the experiment with them."""
        launcher = launcher_gone()
        if launcher is None:
            return False
        self.interrupted = True
        print(  # noqa: T201 - said once, as the worker leaves
            f"trl-rapidfire: worker {self.worker.rank}: its launcher (pid {launcher}) is gone; "
            "stopping at this chunk boundary (finished chunks are kept; run the launch again "
            "to continue)", file=sys.stderr, flush=True)
        return True

    @contextlib.contextmanager
    def _faults_kept(self) -> Iterator[None]:
        """Clean-up after the loop: a disk fault here is noted (the first one is the one
        reported), never raised over the error that ended the loop."""
        try:
            yield
        except ExperimentFault as exc:
            self._fault = self._fault or str(exc)

    def _end_run_call(self, started: float, ok: bool, previous_handler: Any) -> None:
        """What every ``run()`` call does last, however its loop ended."""
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
        with self._faults_kept():
            self._flush_finishes()  # a finished chunk is never lost, whatever stopped
        if self._claimed is not None:
            with self._faults_kept(), self.store.transaction() as st:
                release(st, self._claimed[0], self.worker.id)
            self._claimed = None
        gc.unfreeze()
        self.stats.wall += time.perf_counter() - started
        self._run_started = None
        self.stats.compute = sum(s.compute_seconds for s in self.slots.values())
        self.stats.turns = len(self.schedule)
        self._progress.close()
        self._progress = None
        if ok and self.worker.launched:
            self.schedule = read_schedule_csv(self.schedule_path)
        if not ok:
            # Interrupted: unwind every suspended train(). On a normal end the only
            # suspended runs are stopped ones, kept resumable for a later train().
            self._abort_suspended()
        if self.tracker is not None:
            self.tracker.active.set()
            for slot in self.slots.values():
                if slot.state.status in (RunStatus.STOPPED, RunStatus.DELETED):
                    self.tracker.end_run(slot.name, slot.state.status.value)
            self.tracker.flush()
            self.tracker.polling.clear()  # nothing reads ops until the next train()
            if self.tracker.errors:
                warnings.warn(
                    f"MLflow tracking failed {len(self.tracker.errors)} time(s) (training "
                    f"was not affected); first: {self.tracker.errors[0]}",
                    RuntimeWarning, stacklevel=2,
                )

    # ------------------------------------------------------------------ tracking

    def progress_text(self, slot: RunSlot) -> str:
        """``epoch 1/2 chunk 3/4 step 30/80``."""
        plan, step = slot.plan, slot.state.global_step
        if slot.trainer is None or not plan.chunks:
            return f"step {step}"
        chunk = plan.chunk_at(step) or plan.chunks[-1]
        epochs = plan.chunks[-1].epoch + 1
        per_epoch = sum(1 for c in plan.chunks if c.epoch == chunk.epoch)
        done_in_epoch = chunk.index + (1 if step >= chunk.end_step else 0)
        return (f"epoch {chunk.epoch + 1}/{epochs} chunk {done_in_epoch}/{per_epoch} "
                f"step {step}/{plan.total_steps}")

    def _report(self, slot: RunSlot) -> None:
        if self.tracker is None:
            slot._points.clear()
            return
        self.tracker.log_metrics(slot.name, list(slot._points))
        slot._points.clear()
        self.tracker.set_tags(slot.name, {STATUS_TAG: slot.state.status.value,
                                          PROGRESS_TAG: self.progress_text(slot)})
        if slot.state.status in (RunStatus.COMPLETED, RunStatus.FAILED):
            self.tracker.end_run(slot.name, slot.state.status.value)

    # ------------------------------------------------------------------ control ops

    def queue_op(self, run: str, op: str, source: str = "python",
                 reason: str | None = None) -> None:
        """Apply ``op`` to ``run`` at the next chunk boundary (or the next ``train()``)."""
        with self._ops_lock:
            self._queued_ops.append((source, run, op, reason))
            if source != "tag":
                self._author_ops.add((run, _canonical_op(op)))

    def _consult_policy(self) -> None:
        """Ask the policy about every chunk finished since it was last asked (by any worker)
        and queue its decisions as ops.

        A chunk of this worker counts as finished as soon as it trained, before its checkpoint
        is recorded: a decision must reach the scheduler before the next claim, and ops wait
        for pending records anyway (``apply_ops`` acts on recorded boundaries).
        """
        if self.policy is None or self.worker.rank != 0:
            return
        done = {s.name: s.state.chunks_done for s in self.slots.values()}
        for slot, _, record in self._pending_finishes:
            done[slot.name] = max(done[slot.name], record.number + 1)
        fresh = [s for s in self.slots.values() if done[s.name] > self._policy_seen.get(s.name, 0)]
        if not fresh:
            return
        context = self._policy_context(done)
        decided: set[tuple[str, str]] = set()
        for slot in fresh:
            self._policy_seen[slot.name] = done[slot.name]
            for d in self.policy.on_chunk_end(slot.name, context):
                if d.action == "clone":
                    verb = "clone-warm" if d.warm else "clone"
                    text = f"{verb} {json.dumps(dict(d.overrides), default=str)}"
                else:
                    # Several fresh chunks can lead to the same verdict on a waiting run.
                    if (d.run, d.action) in decided:
                        continue
                    decided.add((d.run, d.action))
                    text = d.action
                self.queue_op(d.run, text, source=f"policy:{d.by or self.policy.name}",
                              reason=d.reason)

    def _policy_context(self, done: dict[str, int]) -> Context:
        runs = {}
        for s in self.slots.values():
            state = s.trainer.state if s.trainer is not None else None
            if s.disk_state is not None and (state is None
                                             or s.disk_state.global_step > state.global_step):
                state = s.disk_state
            runs[s.name] = RunHistory(
                name=s.name, status=s.state.status, chunks_done=done[s.name],
                chunks_total=len(s.plan), chunk_ends=tuple(c.end_step for c in s.plan.chunks),
                log=tuple(state.log_history) if state is not None else (), knobs=s.knobs,
                parent=s.state.parent, training=s.name in self._training_elsewhere,
            )
        return Context(runs, self._wall_seconds())

    def _wall_seconds(self) -> float:
        """Training wall time of the experiment: earlier sessions' (from the shared state)
        plus this one's so far."""
        running = (time.perf_counter() - self._run_started
                   if self._run_started is not None else 0.0)
        return self._wall_before + running

    def _ops_pending(self) -> bool:
        if self.worker.rank != 0:
            return False
        return bool(self._queued_ops) or bool(
            self.tracker is not None and self.tracker.pending_ops()
        )

    def apply_ops(self) -> list[OpRecord]:
        """Apply every pending op (tags polled by the tracker, queued Python ops).

        Under a launch every worker runs the same script, so an op the script queues is
        queued by each, and every worker sees the same tags: the first worker alone applies
        ops, once, and what they change reaches the others through the shared state.
        """
        with self._ops_lock:
            pending, self._queued_ops = self._queued_ops, []
        if self.worker.rank != 0:
            return []
        if self.tracker is not None:
            pending += [("tag", run, text, None)
                        for run, text in self.tracker.pending_ops().items()]
        # A person's op on a run wins over a policy's at the same boundary.
        by_person = {run for source, run, _, _ in pending if not source.startswith("policy")}
        records = []
        for source, run, text, reason in pending:
            automatic = source.startswith("policy")
            if automatic and run in by_person:
                result = "skipped: a person's op on this run wins"
            else:
                try:
                    op = Op("fail") if automatic and text == "fail" else parse_op(text)
                    # Tag text is anyone's who can write to the tracking server: only the
                    # script's own ops (Python calls, its policies) may go beyond
                    # hyperparameters.
                    result = "ok: " + self._apply(run, op, reason, trusted=source != "tag")
                    if automatic:
                        result += f" by {source.split(':', 1)[1]} {reason}"
                except OpError as err:
                    result = f"error: {err}"
            record = OpRecord.now(source, run, text, result)
            records.append(record)
            self.op_log.append(record)
            append_op_row(record, self.output_dir / "ops.csv")
            if self.tracker is not None:
                if source == "tag":  # answered once, even on a run this experiment lacks
                    self.tracker.consume_op(run, text, result)
                elif run in self.slots:
                    self.tracker.set_tags(run, {"rapidfire.op.result": result})
            if run in self.slots:
                self.slots[run].last_op = result
                self._report(self.slots[run])
            if result.startswith("error") and source == "python":
                warnings.warn(f"op {text!r} on {run}: {result}", RuntimeWarning, stacklevel=2)
        return records

    def _apply(self, run: str, op: Op, reason: str | None = None, *,
               trusted: bool = False) -> str:
        if op.verb in ("stop", "resume", "delete", "fail"):
            with self.store.transaction() as st:
                record = st.runs.get(run)
                if record is None or run not in self.slots:
                    raise OpError(f"no run named {run!r}; runs: {sorted(self.slots)}")
                result = _change_status(record, op.verb, reason)
                # A worker may have opened its next chunk's gang meanwhile: not trained now.
                disband_forming_gang(st, run)
                self._sync(st)
            slot = self.slots[run]
            if op.verb == "fail":
                self._forget(slot)
                return result
            if op.verb == "stop" and slot.residency.resident and slot.trainer is not None \
                    and slot.state.chunks_done and slot.local_chunks == slot.state.chunks_done:
                slot.residency.park(self.cache, slot.trainer.optimizer)
                if self._resident is slot:
                    self._resident = None
            return result
        slot = self.slots.get(run)
        if slot is None:
            raise OpError(f"no run named {run!r}; runs: {sorted(self.slots)}")
        if slot.state.status == RunStatus.DELETED:
            raise OpError(f"{run} is deleted; no op applies to it")
        if self.clone_builder is None:
            raise OpError("this experiment cannot clone runs")
        # Under the lock: the clone's name is taken from the shared state, so two workers
        # cloning at once never pick the same one, and the others learn how to build it.
        with self.store.transaction() as st:
            taken = {int(n.rsplit("-", 1)[1]) for n in st.runs if n.rsplit("-", 1)[-1].isdigit()}
            taken |= {s.index for s in self.slots.values()}
            name = f"run-{max(taken) + 1}"
            clone = self.clone_builder(slot, op, name=name, trusted=trusted)
            st.add_run(clone.name, len(clone.plan), _json_knobs(clone.knobs))
            if clone.gang:
                st.gang_size[clone.name] = clone.gang
            st.runs[clone.name].parent = clone.state.parent
            st.runs[clone.name].warm_start = clone.state.warm_start
            st.clones[clone.name] = {"parent": run, "op": str(op)}
            if op.warm and clone.warm_state_tree is not None:
                save_tree(clone.warm_state_tree, self.warm_dir(clone.name))
            self._sync(st)
        if self._progress is not None:
            self._progress.set_total(self.total_chunks)
        return f"created {clone.name}" + (f" warm-started from {run}" if op.warm else "")

    def parent_state(self, slot: RunSlot) -> tuple[list[torch.Tensor], list[Any]]:
        """Copies of ``slot``'s parameter values and per-parameter optimizer state, as of its
        last finished chunk (for a warm-started clone)."""
        optimizer = slot.trainer.optimizer if slot.trainer is not None else None
        if slot.state.chunks_done > slot.local_chunks:
            # Trained by another worker or an earlier process: its state is its checkpoint.
            return self._state_on_disk(slot)
        try:
            return slot.residency.copy_state(self.cache, optimizer)
        except LookupError as err:
            raise OpError(f"{slot.name} has no weights to start from") from err

    def warm_dir(self, name: str) -> Path:
        """Where a warm clone's starting state is kept for the other workers and re-runs."""
        path = self.output_dir / ".rapidfire" / "warm" / check_run_name(name)
        inside(self.output_dir, path)
        return path

    def last_checkpoint(self, slot: RunSlot) -> Path:
        """``slot``'s checkpoint at its last finished chunk (to warm-start a clone from)."""
        ckpt = checkpoint_at(slot.checkpoints, slot.state.global_step) if slot.checkpoints \
            else None
        if ckpt is None:
            raise OpError(f"{slot.name} has no checkpoint at step {slot.state.global_step} to "
                          "warm-start from (a finished run keeps only its final weights); use "
                          "`clone`")
        return ckpt

    def _state_on_disk(self, slot: RunSlot) -> tuple[list[torch.Tensor], list[Any]]:
        ckpt = self.last_checkpoint(slot)
        model = slot.group.model
        if slot.adapter is not None:
            slot.group.attach(slot.adapter)  # its parameters' names are read from the model
        own = {id(p) for p in slot.residency.params}
        named = [(n, p) for n, p in model.named_parameters() if id(p) in own]
        decay = set(slot.trainer.get_decay_parameter_names(model))
        try:
            return run_state_from_checkpoint(ckpt, named, slot.adapter, decay)
        except LookupError as err:
            raise OpError(f"cannot warm-start from {slot.name}'s checkpoint: {err}") from None

    def load_warm_optimizer_state(self, slot: RunSlot) -> None:
        """Inside the clone's ``train()``, once its optimizer exists: give it the parent's
        moments (shapes were checked when the clone was made)."""
        slot.residency.load_optimizer_state(slot.trainer.optimizer, slot.warm_optimizer_state)
        slot.warm_optimizer_state = None

    def activate(self, name: str) -> None:
        """Make ``name``'s weights the live ones in its model (after training, for the best
        run: ``trainer.model``, ``save_model()``, ``evaluate()``)."""
        slot = self.slots[name]
        if slot.weights_on_disk:
            # Trained to the end elsewhere: its final weights are on disk.
            slot.needs_load = True
            self._switch_in(slot)
            slot.trainer._load_from_checkpoint(str(slot.final_dir))
            slot.trainer.state = slot.disk_state
            slot.weights_on_disk = False
            slot.local_chunks = slot.state.chunks_done
            return
        self._switch_in(slot)

    def _abort_suspended(self) -> None:
        # Runs left suspended (the loop was interrupted) unwind their train() calls now.
        for slot in self.slots.values():
            if slot.coroutine is not None and not slot.coroutine.finished:
                slot.coroutine.abort()

    def failures(self) -> dict[str, str]:
        return {s.name: s.error or s.state.error or "failed" for s in self.slots.values()
                if s.state.status == RunStatus.FAILED}


_RETRY = object()  # _claim: claim again now (a write it waited for ended, or clones were built)


def _change_status(record: RunState, verb: str, reason: str | None = None) -> str:
    status = record.status
    if status == RunStatus.DELETED:
        raise OpError(f"{record.name} is deleted; no op applies to it")
    if verb == "fail":  # only policies fail runs (a NaN metric), with their reason
        if not status.schedulable:
            raise OpError(f"{record.name} is {status.value}; only pending or running runs fail")
        record.fail(reason or "failed by a policy")
        return "failed"
    if verb == "stop":
        if not status.schedulable:
            raise OpError(f"{record.name} is {status.value}; only pending or running runs stop")
        record.move(RunStatus.STOPPED)
        return f"stopped at step {record.global_step}"
    if verb == "resume":
        if status != RunStatus.STOPPED:
            raise OpError(f"{record.name} is {status.value}; only a stopped run can be resumed")
        record.resume()
        return f"resumed at step {record.global_step}"
    record.move(RunStatus.DELETED)
    return "deleted"


@contextlib.contextmanager
def _disk_faults(what: str, path: Path) -> Iterator[None]:
    """Our own writes: a disk fault becomes an :class:`ExperimentFault` naming ``path``."""
    try:
        yield
    except ExperimentFault:
        raise
    except Exception as exc:
        detail = disk_fault(exc, ours=True)
        if detail is None:
            raise
        raise ExperimentFault(fault_message(what, path, detail)) from exc


def _canonical_op(text: str) -> str:
    """The op as the shared state records it (``str(parse_op(text))``), or ``text``."""
    try:
        return str(parse_op(text))
    except OpError:
        return text


def _json_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    # The shared state is JSON: a LoRA config or a function is kept as its description.
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else describe_value(v)
            for k, v in knobs.items()}


def _load_trainer_state(path: Path) -> Any:
    from transformers import TrainerState

    return TrainerState.load_from_json(str(path))


def _points_of(log_history: list[dict[str, Any]]) -> list[tuple[str, float, int, int]]:
    now = int(time.time() * 1000)
    return [
        (key, float(value), int(entry.get("step", 0)), now)
        for entry in log_history for key, value in entry.items()
        if key not in ("step",) and isinstance(value, (int, float)) and not isinstance(value, bool)
    ]


class _LeaseKeeper:
    """Renews this worker's claim while a chunk trains (a thread: the chunk holds the main
    one). On this machine a dead worker is noticed by its pid; the lease is what tells workers
    on other machines."""

    def __init__(self, engine: Engine, run: str) -> None:
        self._engine, self._run = engine, run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rapidfire-lease", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        engine = self._engine
        while not self._stop.wait(engine.lease_seconds / 4):
            try:
                with engine.store.transaction(durable=False) as st:
                    renew(st, self._run, engine.worker.id, now=time.time(),
                          lease_seconds=engine.lease_seconds)
            except Exception:  # noqa: BLE001 - the next renewal retries
                pass

    def stop(self) -> None:
        self._stop.set()


def _install_sigint(engine: Engine) -> Any:
    """First Ctrl-C: finish the chunk in progress, then stop. Second: stop now."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        if engine.interrupted:
            raise KeyboardInterrupt
        engine.interrupted = True
        print(  # noqa: T201 - the person pressing Ctrl-C needs to know what happens
            "\ntrl-rapidfire: stopping at the next chunk boundary (Ctrl-C again to stop now; "
            "finished chunks are kept either way, re-run the script to continue)",
            flush=True,
        )

    return signal.signal(signal.SIGINT, handler)
