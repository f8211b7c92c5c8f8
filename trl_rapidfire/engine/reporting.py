"""The engine's side of the tracker (:mod:`trl_rapidfire.tracking.tracker`): what it is told at
every
chunk end and when a ``run()`` call ends, and the ops it hears back. Without a tracker
(``report_to`` not MLflow) it tells nothing and hears nothing."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from typing import Any

from ..shared_state.runs import INTERRUPTED, RunStatus
from ..tracking.tags import PROGRESS_TAG, STATUS_TAG, STOPPED_BY_TAG
from ..tracking.tracker import Tracker
from .records import RunSlot

__all__ = ["Reporter", "chunks_trained", "progress_text"]


def chunks_trained(slot: RunSlot) -> int:
    """The chunks of ``slot``'s plan it has trained: those recorded in the shared state (by any
    worker), or, when more, those its steps in the runs table cover (a chunk trained here is
    recorded once its checkpoint is written, in the background). The progress bar's count is
    the sum of these, so that a table's header does not lag its rows (``chunks 1/4`` above two
    runs that had both trained their first 2-step chunk, one not recorded yet)."""
    state = slot.latest_trainer_state()
    step = int(state.global_step) if state is not None else 0
    by_steps = sum(1 for c in slot.plan.chunks if c.end_step <= step)
    return max(min(slot.state.chunks_done, len(slot.plan)), by_steps)


def progress_text(slot: RunSlot) -> str:
    """``chunk 3/8 (epoch 1/2, step 30/80)``: chunks trained of the run's whole plan (the count
    the progress bar and ``trl-rapidfire status`` use, never per epoch, which read
    ``epoch 2/2 chunk 0/4`` right after an epoch ended), the epoch its last trained chunk
    belongs to, and its optimizer steps; a completed run reads ``done 8/8 (step 80/80)``."""
    plan, step = slot.plan, slot.state.global_step
    if not plan.chunks:  # failed before its plan was made
        return f"step {step}"
    done = sum(1 for c in plan.chunks if c.end_step <= step)
    steps = f"step {step}/{plan.total_steps}"
    if slot.state.status == RunStatus.COMPLETED:
        return f"done {done}/{len(plan)} ({steps})"
    epoch = plan.chunks[done - 1].epoch + 1 if done else 1
    epochs = plan.chunks[-1].epoch + 1
    return f"chunk {done}/{len(plan)} (epoch {epoch}/{epochs}, {steps})"


class Reporter:
    """Hands the tracker (the trainer layer's, or ``None``) what the engine has to say.

    The tracker only queues in memory; its own thread writes to MLflow, while chunks compute
    (:meth:`set_active`), because each MLflow call is milliseconds of Python under the GIL.
    """

    def __init__(self, tracker: Tracker | None = None) -> None:
        self.tracker = tracker
        self._leader = False  # this worker speaks for the experiment (its parent run)
        # Runs whose status tag says "interrupted" (a run() call ended without finishing):
        # running again from the next call on.
        self._interrupted: list[str] = []
        if tracker is not None:
            # MLflow's work (the store opened, the runs registered) waits while the main thread
            # builds the runs: the tracking thread's Python would take the GIL from it (128
            # runs built in 1.95 s with it beside, 0.85 s without). The trainer layer lets it
            # go once they are built (until train() starts), a flush or a chunk does too.
            tracker.active.clear()

    def ensure_run(self, name: str, params: dict, tags: dict[str, str]) -> None:
        """The run's MLflow run is queued: found or created, with ``params`` and (if new)
        ``tags``, by the tracker's thread while runs train (never waited for here)."""
        if self.tracker is not None:
            self.tracker.ensure_run(name, params, {"rapidfire.status": "pending", **tags})

    def report(self, slot: RunSlot) -> None:
        """The run's metric points since it was last reported, its status and progress."""
        if self.tracker is None:
            slot.turn.points.clear()
            return
        self.tracker.log_metrics(slot.name, list(slot.turn.points))
        slot.turn.points.clear()
        self.tracker.set_tags(slot.name, {STATUS_TAG: slot.state.status.value,
                                          PROGRESS_TAG: progress_text(slot)})
        if slot.state.status in (RunStatus.COMPLETED, RunStatus.FAILED):
            self.tracker.end_run(slot.name, slot.state.status.value)

    def recovered(self, slot: RunSlot) -> None:
        """A run taken from the shared state with chunks done (an earlier session, another
        worker): report it, with the points of chunks that reached disk but not MLflow (a
        crash in between), from the checkpoint's log history; MLflow keeps one per step."""
        if self.tracker is None:
            return
        state = slot.outcome.disk_state
        if state is not None:
            self.tracker.log_metrics(slot.name, points_of(state.log_history))
        self.report(slot)

    def start(self, *, polling: bool) -> None:
        """A ``run()`` call begins; ``polling``: this worker applies ops from tags."""
        self._leader = polling
        if self.tracker is not None:
            # In the rotation again (a re-run's runs are reported when registered).
            for name in self._interrupted:
                self.tracker.set_tags(name, {STATUS_TAG: RunStatus.RUNNING.value})
            self._interrupted = []
            self.tracker.active.clear()  # until the first chunk computes (see __init__)
            self.tracker.resume()
            if polling:
                self.tracker.polling.set()
                self.tracker.experiment_started()
            else:
                self.tracker.polling.clear()

    def set_active(self, active: bool) -> None:
        """MLflow work runs while a chunk computes, and waits while the engine switches."""
        if self.tracker is not None:
            if active:
                self.tracker.active.set()
            else:
                self.tracker.active.clear()

    def finish(self, slots: Iterable[RunSlot], outcome: str, *, stacklevel: int) -> None:
        """A ``run()`` call ends (``outcome``: ``finished``, ``failed`` or ``killed``): end
        the runs that left the rotation and the experiment's parent run, write what is queued,
        stop reading ops, and say if tracking failed."""
        if self.tracker is None:
            return
        self.tracker.active.set()
        slots = list(slots)
        for slot in slots:
            if slot.state.status in (RunStatus.STOPPED, RunStatus.DELETED):
                self.tracker.end_run(slot.name, slot.state.status.value)
            elif (outcome != "finished" and self._leader
                  and slot.state.status == RunStatus.RUNNING):
                # In the rotation of an experiment that stopped training: the views say so
                # (shared_state.runs.shown_status) until a re-run trains it again.
                self.tracker.set_tags(slot.name, {STATUS_TAG: INTERRUPTED})
                self._interrupted.append(slot.name)
            elif self._leader and slot.state.status == RunStatus.PENDING:
                # Never trained, and nothing trains it now (a Ctrl-C, an error, the runs
                # before it stopped): not the RUNNING MLflow made it with.
                self.tracker.mark_scheduled(slot.name)
        if self._leader:
            if outcome == "finished" and slots and all(
                    s.state.status == RunStatus.FAILED for s in slots):
                outcome = "failed"  # train() raises: every run failed
            self.tracker.experiment_ended(outcome)
        self.tracker.polling.clear()  # nothing reads ops until the next train()
        self.tracker.suspend()  # what is queued is written; its thread ends until then
        if self.tracker.errors:
            warnings.warn(
                f"MLflow tracking failed {len(self.tracker.errors)} time(s) (training "
                f"was not affected); first: {self.tracker.errors[0]}",
                RuntimeWarning, stacklevel=stacklevel + 1,
            )

    def stopped_by(self, run: str, who: str | None) -> None:
        """``run`` was stopped by ``who`` (a policy's name, or ``person (<channel>)``), or
        resumed (``None``): its tag says who stopped it while it is stopped."""
        if self.tracker is not None:
            if who is None:
                self.tracker.delete_tag(run, STOPPED_BY_TAG)
            else:
                self.tracker.set_tags(run, {STOPPED_BY_TAG: who})

    # ------------------------------------------------------------------ ops from tags

    def pending_ops(self) -> dict[str, str]:
        """The ops set as tags and not answered yet: ``{run: op text}``."""
        return self.tracker.pending_ops() if self.tracker is not None else {}

    def answer_op(self, source: str, run: str, text: str, result: str, *, known: bool) -> None:
        """Say how an op ended: a tag's op is answered once (even on a run this experiment
        lacks), any other's result is shown on its run (``known``: the experiment has it)."""
        if self.tracker is not None:
            if source == "tag":
                self.tracker.consume_op(run, text, result)
            elif known:
                self.tracker.set_tags(run, {"rapidfire.op.result": result})


def points_of(log_history: list[dict[str, Any]]) -> list[tuple[str, float, int, int]]:
    """The numbers of a log history as metric points (key, value, step, now in ms)."""
    now = int(time.time() * 1000)
    return [
        (key, float(value), int(entry.get("step", 0)), now)
        for entry in log_history for key, value in entry.items()
        if key not in ("step",) and isinstance(value, (int, float)) and not isinstance(value, bool)
    ]
