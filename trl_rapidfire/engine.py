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

The engine knows nothing of SFT, DPO or GRPO: the trainer layer builds each run's Trainer and
registers it with :meth:`Engine.add_run`.
"""

from __future__ import annotations

import copy
import gc
import math
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from .accelerate_state import restore_accelerate_state, snapshot_accelerate_state
from .cache import StateCache
from .chunks import ChunkPlan, plan_chunks, training_steps
from .control import Op, OpError, OpRecord, append_op_row, parse_op
from .models import ModelGroup, ModelPool
from .progress import ExperimentProgress
from .residency import Residency
from .results import RunResult, latest_metrics
from .runs import RunState, RunStatus
from .schedule import ChunkRecord, append_schedule_row, write_schedule_csv
from .scheduler import RunView, pick_next
from .switch import Aborted, RngState, RunCoroutine
from .tracking import PROGRESS_TAG, STATUS_TAG, Tracker

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

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = RunState(name=self.name, knobs=dict(self.knobs))

    @property
    def final_dir(self) -> Path:
        return self.run_dir / "final"

    def result(self) -> RunResult:
        if self.trainer is None:  # failed before its trainer existed
            return RunResult(self.name, dict(self.knobs), self.state.status, 0,
                             str(self.run_dir), {}, self.error)
        metrics = latest_metrics(self.trainer.state.log_history)
        if self.train_output is not None:
            metrics.update(
                {k: v for k, v in (self.train_output.metrics or {}).items()
                 if isinstance(v, (int, float))}
            )
        return RunResult(
            name=self.name,
            knobs=dict(self.knobs),
            status=self.state.status,
            global_step=int(self.trainer.state.global_step),
            output_dir=str(self.run_dir),
            metrics=metrics,
            error=self.error,
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

    def on_step_begin(self, args, state, control, **kwargs):
        slot = self.slot
        step = state.global_step
        if step in slot.plan.boundaries and step not in slot._yielded_at:
            slot._yielded_at.add(step)
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
        worker: this worker's id, recorded in the schedule.
        save_final: how a finished run saves its final weights (default: ``save_model`` into
            ``runs/<name>/final``).
        pool: the shared base models (moved on and off a CUDA device as runs take turns).
    """

    def __init__(
        self,
        output_dir: str | Path,
        cache: StateCache,
        *,
        progress: bool = True,
        worker: int = 0,
        save_final: Callable[[RunSlot], None] | None = None,
        pool: ModelPool | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.cache = cache
        self.worker = worker
        self.pool = pool
        self.tracker: Tracker | None = None
        self.op_log: list[OpRecord] = []
        self.clone_builder: Callable[[RunSlot, Op], RunSlot] | None = None
        self._queued_ops: list[tuple[str, str, str]] = []
        self.slots: dict[str, RunSlot] = {}
        self.schedule: list[ChunkRecord] = []
        self.stats = EngineStats()
        self._progress_enabled = progress
        self._progress: ExperimentProgress | None = None
        self._resident: RunSlot | None = None
        self._save_final = save_final or (lambda slot: slot.trainer.save_model(str(slot.final_dir)))

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
    ) -> RunSlot:
        """Register a freshly built trainer as a run.

        Call right after building the trainer: its RNG streams and accelerate's state are
        captured now, as the run's starting point (what they would be in a script that built
        this trainer alone and then called ``train()``).
        """
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
        )
        trainer.add_callback(ChunkCallback(self, slot))
        stateful = getattr(trainer, "_rf_stateful", lambda: [])()
        slot.stateful = list(stateful)
        slot._stateful_states = [copy.deepcopy(obj.state_dict()) for obj in slot.stateful]
        slot.rng = RngState.capture()
        slot.accelerate = snapshot_accelerate_state()
        self.slots[name] = slot
        return slot

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
        return [s.result() for s in self.slots.values()]

    # ------------------------------------------------------------------ run side

    def end_turn(self, slot: RunSlot) -> None:
        """Called inside the run's coroutine at a chunk boundary: suspend until resumed."""
        slot.compute_seconds += time.perf_counter() - slot._resumed_at
        slot.coroutine.suspend()
        slot._resumed_at = time.perf_counter()

    def _run_main(self, slot: RunSlot) -> None:
        slot._resumed_at = time.perf_counter()
        try:
            slot.train_output = slot.trainer.train()
            self._save_final(slot)
        except Aborted:
            pass
        except Exception as exc:  # a run's failure must not stop the others
            slot.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            slot.error_traceback = traceback.format_exc()
        finally:
            # KeyboardInterrupt and SystemExit pass through to the scheduler, which stops.
            slot.finished = True
            slot.compute_seconds += time.perf_counter() - slot._resumed_at

    # ------------------------------------------------------------------ scheduler side

    def _views(self) -> list[RunView]:
        return [
            RunView(s.name, s.index, s.state.status, s.state.chunks_done, len(s.plan))
            for s in self.slots.values()
        ]

    def _switch_in(self, slot: RunSlot) -> None:
        prev = self._resident
        if prev is not None and prev is not slot and prev.residency.resident:
            prev.residency.park(self.cache, prev.trainer.optimizer)
        if self.pool is not None:
            self.pool.make_room(slot.group, slot.trainer.args.device)
        if not slot.residency.resident:
            if slot.residency.key in self.cache:
                slot.residency.unpark(self.cache, slot.trainer.optimizer)
            elif slot.group.initial_weights is not None:
                slot.residency.load_initial(slot.group.initial_weights)
            else:
                raise RuntimeError(f"{slot.name}: no state to restore.")
        self._resident = slot
        if slot.adapter is not None and slot.group.model.active_adapter != slot.adapter:
            slot.group.activate(slot.adapter)
        restore_accelerate_state(slot.accelerate)
        for obj, state in zip(slot.stateful, slot._stateful_states):
            obj.load_state_dict(copy.deepcopy(state))
        slot.rng.restore()

    def _switch_out(self, slot: RunSlot) -> None:
        slot.rng = RngState.capture()
        slot.accelerate = snapshot_accelerate_state()
        slot._stateful_states = [copy.deepcopy(obj.state_dict()) for obj in slot.stateful]

    def _turn(self, slot: RunSlot) -> None:
        start_step = int(slot.trainer.state.global_step)
        chunk = slot.plan.chunk_at(start_step)
        self._switch_in(slot)
        if slot.state.status == RunStatus.PENDING:
            slot.state.move(RunStatus.RUNNING)
        if slot.coroutine is None:
            slot.coroutine = RunCoroutine(lambda: self._run_main(slot), name=slot.name)
        if self._progress is not None:
            self._progress.start(slot.name)
        t0 = time.time()
        if self.tracker is not None:
            self.tracker.active.set()  # MLflow work runs while the chunk computes...
        try:
            slot.coroutine.resume()
        finally:
            if self.tracker is not None:
                self.tracker.active.clear()  # ...and waits while the engine switches
        t1 = time.time()
        self._switch_out(slot)
        end_step = int(slot.trainer.state.global_step)
        slot.state.global_step = end_step

        if slot.error is not None:
            slot.state.fail(slot.error)
            slot.residency.drop(self.cache)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # after an out-of-memory error, give the rest back
            if self._resident is slot:
                self._resident = None
            warnings.warn(f"{slot.name} failed: {slot.error}", RuntimeWarning, stacklevel=2)
        elif end_step > start_step and chunk is not None:
            slot.state.chunks_done += 1
            record = ChunkRecord(
                run=slot.name, epoch=chunk.epoch, chunk=chunk.index, number=chunk.number,
                worker=self.worker, start_time=t0, end_time=t1,
                start_step=start_step, end_step=end_step,
            )
            self.schedule.append(record)
            append_schedule_row(record, self.output_dir / "schedule.csv")
        if slot.finished and slot.error is None:
            if slot.state.chunks_done < len(slot.plan):
                # train() ended early (a callback stopped it): the run is done all the same.
                slot.state.chunks_done = len(slot.plan)
            slot.state.move(RunStatus.COMPLETED)
        self._report(slot)
        if self._progress is not None and slot.error is None:
            self._progress.chunk_done(self.results())

    def run(self) -> None:
        """Train every registered run to the end (or to its failure)."""
        self._progress = ExperimentProgress(self.total_chunks, enabled=self._progress_enabled)
        write_schedule_csv(self.schedule, self.output_dir / "schedule.csv")
        # Every run's train() starts with accelerate's free_memory(), a full gc.collect() over
        # everything the process holds (~0.2 s per run with the HF stack imported). The models,
        # datasets and trainers built so far live as long as the experiment: freeze them out
        # of the collector's view for its duration.
        gc.collect()
        gc.freeze()
        if self.tracker is not None:
            self.tracker.polling.set()
        started = time.perf_counter()
        ok = False
        try:
            while True:
                self.apply_ops()
                name = pick_next(self._views(), self._resident.name if self._resident else None)
                if name is None:
                    break
                self._turn(self.slots[name])
            ok = True
        finally:
            gc.unfreeze()
            self.stats.wall += time.perf_counter() - started
            self.stats.compute = sum(s.compute_seconds for s in self.slots.values())
            self.stats.turns = len(self.schedule)
            self._progress.close()
            self._progress = None
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

    def queue_op(self, run: str, op: str, source: str = "python") -> None:
        """Apply ``op`` to ``run`` at the next chunk boundary (or the next ``train()``)."""
        self._queued_ops.append((source, run, op))

    def apply_ops(self) -> list[OpRecord]:
        """Apply every pending op (tags polled by the tracker, queued Python ops)."""
        pending = list(self._queued_ops)
        self._queued_ops.clear()
        if self.tracker is not None:
            pending += [("tag", run, text) for run, text in self.tracker.pending_ops().items()]
        records = []
        for source, run, text in pending:
            try:
                result = "ok: " + self._apply(run, parse_op(text))
            except OpError as err:
                result = f"error: {err}"
            record = OpRecord.now(source, run, text, result)
            records.append(record)
            self.op_log.append(record)
            append_op_row(record, self.output_dir / "ops.csv")
            if self.tracker is not None:
                if source == "tag" and run in self.slots:
                    self.tracker.consume_op(run, text, result)
                elif run in self.slots:
                    self.tracker.set_tags(run, {"rapidfire.op.result": result})
            if run in self.slots:
                self._report(self.slots[run])
            if result.startswith("error") and source != "tag":
                warnings.warn(f"op {text!r} on {run}: {result}", RuntimeWarning, stacklevel=2)
        return records

    def _apply(self, run: str, op: Op) -> str:
        slot = self.slots.get(run)
        if slot is None:
            raise OpError(f"no run named {run!r}; runs: {sorted(self.slots)}")
        status = slot.state.status
        if status == RunStatus.DELETED:
            raise OpError(f"{run} is deleted; no op applies to it")
        if op.verb == "stop":
            if not status.schedulable:
                raise OpError(f"{run} is {status.value}; only pending or running runs stop")
            slot.state.move(RunStatus.STOPPED)
            if slot.residency.resident and slot.trainer is not None and slot.state.chunks_done:
                slot.residency.park(self.cache, slot.trainer.optimizer)
                if self._resident is slot:
                    self._resident = None
            return f"stopped at step {slot.state.global_step}"
        if op.verb == "resume":
            if status != RunStatus.STOPPED:
                raise OpError(f"{run} is {status.value}; only a stopped run can be resumed")
            slot.state.resume()
            return f"resumed at step {slot.state.global_step}"
        if op.verb == "delete":
            slot.state.move(RunStatus.DELETED)
            if slot.coroutine is not None and not slot.coroutine.finished:
                slot.coroutine.abort()
            slot.residency.drop(self.cache)
            if self._resident is slot:
                self._resident = None
            return "deleted"
        if self.clone_builder is None:
            raise OpError("this experiment cannot clone runs")
        clone = self.clone_builder(slot, op)
        if self._progress is not None:
            self._progress.set_total(self.total_chunks)
        return f"created {clone.name}" + (f" warm-started from {run}" if op.warm else "")

    def parent_state(self, slot: RunSlot) -> tuple[list[torch.Tensor], list[Any]]:
        """Copies of ``slot``'s parameter values and per-parameter optimizer state, as of its
        last finished chunk (for a warm-started clone)."""
        optimizer = slot.trainer.optimizer if slot.trainer is not None else None
        try:
            return slot.residency.copy_state(self.cache, optimizer)
        except LookupError as err:
            raise OpError(f"{slot.name} has no weights to start from") from err

    def load_warm_optimizer_state(self, slot: RunSlot) -> None:
        """Inside the clone's ``train()``, once its optimizer exists: give it the parent's
        moments (shapes were checked when the clone was made)."""
        slot.residency.load_optimizer_state(slot.trainer.optimizer, slot.warm_optimizer_state)
        slot.warm_optimizer_state = None

    def activate(self, name: str) -> None:
        """Make ``name``'s weights the live ones in its model (after training, for the best
        run: ``trainer.model``, ``save_model()``, ``evaluate()``)."""
        slot = self.slots[name]
        self._switch_in(slot)

    def _abort_suspended(self) -> None:
        # Runs left suspended (the loop was interrupted) unwind their train() calls now.
        for slot in self.slots.values():
            if slot.coroutine is not None and not slot.coroutine.finished:
                slot.coroutine.abort()

    def failures(self) -> dict[str, str]:
        return {s.name: s.error for s in self.slots.values() if s.error is not None}
