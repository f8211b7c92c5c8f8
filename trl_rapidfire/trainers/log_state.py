"""A run's logs across a resume: what the Trainer's and TRL's next logs carry over from the
steps already trained, saved in every boundary checkpoint and put back when the run continues
from it, so that a run killed and re-run logs what the run trained through logs.

The Trainer's checkpoint holds the weights, optimizer, schedule, random streams and
``trainer_state.json`` (log history, step, token count), but not what sits between two logs:
the loss summed since the last log, the step of that log, the logged losses' sum that
``train_loss`` divides, and TRL's metric values since the last log and its token count
(:func:`~trl_rapidfire.runtime.foreign_internals.log_carry`). A resumed ``train()`` starts
them afresh: its first ``loss`` averages the steps since the resume, ``num_tokens`` restarts at
0, ``mean_token_accuracy`` and TRL's other averages miss the steps before the resume, and
``train_loss`` is the mean over the resumed session's steps only.

Here: :func:`checkpoint_files` adds them to each boundary checkpoint (``rf_log_state.json``,
exact JSON reprs); a run's ``train(resume_from_checkpoint=...)`` reads them (:func:`arm`) and
:class:`RestoreLogs` puts them back at ``on_train_begin``, which the Trainer calls right after
setting its own up and before the first step. ``train_loss`` (and ``train()``'s
``training_loss``) is then the mean over the run's steps since its first, as the run trained
through computes it; the speed metrics stay the resumed ``train()``'s own (its runtime, the
samples and steps it trained).
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..runtime.foreign_internals import log_carry, restore_log_carry, total_loss_scalar
from ..storage.outside_text import STATE_BYTES
from ..storage.own_files import read_json

__all__ = ["LOG_STATE_NAME", "RestoreLogs", "arm", "checkpoint_files", "whole_run_output",
           "whole_run_train_loss", "write_into"]

LOG_STATE_NAME = "rf_log_state.json"
_VERSION = 1


@dataclass
class _Session:
    """One ``train()`` call's logging, as this module sees it."""

    # The step the run's train_loss averages from (its first step of training: 0, or where an
    # earlier train() that these logs continue began).
    start: int
    # Whether this train() continues the logs of an earlier one (restored from a checkpoint).
    restored: bool


def _file_name(trainer: Any) -> str:
    """Each process of a gang keeps its own (the loss summed since the last log is its own
    until a log gathers it), as the Trainer keeps each one's random streams."""
    if getattr(trainer.args, "world_size", 1) > 1:
        return f"rf_log_state_{trainer.args.process_index}.json"
    return LOG_STATE_NAME


def checkpoint_files(trainer: Any) -> dict[str, bytes]:
    """The file of ``trainer``'s log state now (at a chunk boundary, in the run's turn), by
    name, for its boundary checkpoint."""
    session: _Session | None = getattr(trainer, "_rf_logs", None)
    saved = {
        "version": _VERSION,
        "step": int(trainer.state.global_step),
        "start": session.start if session is not None else None,
        "carry": log_carry(trainer),
    }
    # json writes a float as its shortest exact repr (NaN too, which GRPO's metrics may hold).
    return {_file_name(trainer): json.dumps(saved).encode("utf-8")}


def write_into(trainer: Any, folder: Path) -> None:
    """:func:`checkpoint_files` written into ``folder`` (a gang member's share of the
    checkpoint it writes with the others)."""
    for name, data in checkpoint_files(trainer).items():
        (folder / name).write_bytes(data)


def arm(trainer: Any, resume_from_checkpoint: Any) -> None:
    """At the start of ``trainer.train(resume_from_checkpoint)``: read the log state of the
    checkpoint it continues from, for :class:`RestoreLogs` to put back (none: the logs start
    afresh, as a plain Trainer's)."""
    trainer._rf_logs_pending = None
    if not isinstance(resume_from_checkpoint, (str, Path)):
        return
    path = Path(resume_from_checkpoint) / _file_name(trainer)
    try:
        # Bounded, never through a link or from a FIFO: the folder may have been edited.
        saved = read_json(path, max_bytes=STATE_BYTES)
    except FileNotFoundError:  # a checkpoint written without it: the Trainer's own resume
        return
    if isinstance(saved, dict) and saved.get("version") == _VERSION:
        trainer._rf_logs_pending = saved


class RestoreLogs(TrainerCallback):
    """Puts an armed log state back once ``train()`` has set the Trainer's up; records where
    the run's ``train_loss`` averages from."""

    def __init__(self, trainer: Any) -> None:
        # Weakly: the trainer holds this callback.
        self._trainer = weakref.ref(trainer)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self._trainer()
        if trainer is None:
            return
        # Kept until the next train() call: a retry inside this one (auto_find_batch_size)
        # loads the same checkpoint again.
        saved = getattr(trainer, "_rf_logs_pending", None)
        step = int(state.global_step)
        # Only the state of the very step this train() continues from fits its logs.
        if saved is None or saved.get("step") != step:
            trainer._rf_logs = _Session(start=step, restored=False)
            return
        restore_log_carry(trainer, saved.get("carry") or {})
        start = saved.get("start")
        trainer._rf_logs = _Session(start=start if isinstance(start, int) else step,
                                    restored=True)


def whole_run_train_loss(trainer: Any, logs: dict[str, Any]) -> None:
    """In ``trainer.log(logs)``: the final ``train_loss`` of a train() that continued an
    earlier one's logs, over the run's steps since its first, exactly as the Trainer computes
    it for a train() that ran them all (the Trainer divides by the steps of this call)."""
    session: _Session | None = getattr(trainer, "_rf_logs", None)
    if session is None or not session.restored or "train_loss" not in logs:
        return
    total = total_loss_scalar(trainer)
    if total is not None:
        steps = int(trainer.state.global_step) - session.start
        logs["train_loss"] = total / max(steps, 0.001)


def whole_run_output(trainer: Any, output: Any) -> Any:
    """``train()``'s ``TrainOutput`` with the ``training_loss`` its final log recorded (see
    :func:`whole_run_train_loss`)."""
    session: _Session | None = getattr(trainer, "_rf_logs", None)
    metrics = getattr(output, "metrics", None)
    if session is None or not session.restored or not isinstance(metrics, dict) \
            or "train_loss" not in metrics:
        return output
    return output._replace(training_loss=metrics["train_loss"])
