"""The engine's side of the tracker (:mod:`trl_rapidfire.tracking.tracker`): what it is told at
every
chunk end and when a ``run()`` call ends, and the ops it hears back. Without a tracker
(``report_to`` not MLflow) it tells nothing and hears nothing."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from typing import Any

from ..shared_state.runs import RunStatus
from ..tracking.tags import PROGRESS_TAG, STATUS_TAG
from ..tracking.tracker import Tracker
from .records import RunSlot

__all__ = ["Reporter", "progress_text"]


def progress_text(slot: RunSlot) -> str:
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


class Reporter:
    """Hands the tracker (the trainer layer's, or ``None``) what the engine has to say.

    The tracker only queues in memory; its own thread writes to MLflow, while chunks compute
    (:meth:`set_active`), because each MLflow call is milliseconds of Python under the GIL.
    """

    def __init__(self, tracker: Tracker | None = None) -> None:
        self.tracker = tracker
        self._leader = False  # this worker speaks for the experiment (its parent run)

    def ensure_run(self, name: str, params: dict, tags: dict[str, str]) -> None:
        """The run's MLflow run exists, with ``params`` and (if new) ``tags``."""
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
