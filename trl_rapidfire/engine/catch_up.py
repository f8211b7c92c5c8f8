"""What a worker learns from disk about a run that moved on elsewhere.

When the shared state says a run has done more chunks than this worker trained of it
(another worker, or an earlier process, went on), the run's weights are in its final folder
or its newest checkpoint. This finds which, and reads the trainer state there, so that the
run's next turn here continues from it; the tensors themselves are loaded by that turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..shared_state.runs import RunState, RunStatus
from ..storage.checkpoints import checkpoint_at
from ..storage.outside_text import STATE_BYTES, OutsideTextError
from ..storage.own_files import read_json
from .records import RunSlot, WeightsAt

__all__ = ["catch_up_from_disk", "load_trainer_state"]


def catch_up_from_disk(slot: RunSlot, record: RunState) -> None:
    """``record`` is ahead of what this worker trained of ``slot``: point the slot at the run's
    final weights (a completed run) or at the checkpoint of ``record``'s step."""
    if record.status == RunStatus.COMPLETED:
        final = slot.final_dir
        if (final / "trainer_state.json").is_file() and slot.turn.weights is not WeightsAt.FINAL:
            slot.outcome.disk_state = load_trainer_state(final / "trainer_state.json")
            out = read_json(final / "train_output.json")
            from transformers.trainer_utils import TrainOutput

            slot.outcome.train_output = TrainOutput(out["global_step"], out["training_loss"],
                                            out["metrics"])
            slot.turn.weights = WeightsAt.FINAL
    elif slot.checkpoints is not None and record.global_step != getattr(
        slot.outcome.disk_state, "global_step", None
    ):
        ckpt = checkpoint_at(slot.checkpoints, record.global_step)
        if ckpt is not None:
            slot.outcome.disk_state = load_trainer_state(ckpt / "trainer_state.json")


def load_trainer_state(path: Path) -> Any:
    """A checkpoint's ``trainer_state.json``, read within the bounds of any state file (it is
    in the experiment's folder, which others may write to); errors name the file."""
    from transformers import TrainerState

    doc = read_json(path, max_bytes=STATE_BYTES)
    if not isinstance(doc, dict):
        raise OutsideTextError(f"{path} is not a trainer state (a JSON object)")
    try:
        return TrainerState(**doc)
    except TypeError as err:
        raise OutsideTextError(f"{path} is not a trainer state: {err}") from None
