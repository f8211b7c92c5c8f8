"""What a worker learns from disk about a run that moved on elsewhere.

When the shared state says a run has done more chunks than this worker trained of it
(another worker, or an earlier process, went on), the run's weights are in its final folder
or its newest checkpoint. This finds which, and reads the trainer state there, so that the
run's next turn here continues from it; the tensors themselves are loaded by that turn.
"""

from __future__ import annotations

from ..shared_state.runs import RunState, RunStatus
from ..storage.checkpoints import checkpoint_at
from ..storage.own_files import read_json
from .records import RunSlot, WeightsAt
from .support import load_trainer_state

__all__ = ["catch_up_from_disk"]


def catch_up_from_disk(slot: RunSlot, record: RunState) -> None:
    """``record`` is ahead of what this worker trained of ``slot``: point the slot at the run's
    final weights (a completed run) or at the checkpoint of ``record``'s step."""
    if record.status == RunStatus.COMPLETED:
        final = slot.final_dir
        if (final / "trainer_state.json").is_file() and slot.weights is not WeightsAt.FINAL:
            slot.disk_state = load_trainer_state(final / "trainer_state.json")
            out = read_json(final / "train_output.json")
            from transformers.trainer_utils import TrainOutput

            slot.train_output = TrainOutput(out["global_step"], out["training_loss"],
                                            out["metrics"])
            slot.weights = WeightsAt.FINAL
    elif slot.checkpoints is not None and record.global_step != getattr(
        slot.disk_state, "global_step", None
    ):
        ckpt = checkpoint_at(slot.checkpoints, record.global_step)
        if ckpt is not None:
            slot.disk_state = load_trainer_state(ckpt / "trainer_state.json")
