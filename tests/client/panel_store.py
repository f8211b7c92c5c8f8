"""An MLflow store as a training experiment leaves it, written by the Tracker itself (no
training): for the control panel's tests, which need many runs at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

from trl_rapidfire.tracking.tracker import Tracker

STATUSES = ("running", "stopped", "completed", "failed")


def lora(i: int) -> str:
    """Run ``i``'s ``peft_config`` as the Tracker logs one (``describe_value``)."""
    return f"LoraConfig(r={4 << (i % 3)}, alpha={8 << (i % 2)}, targets=['q_proj', 'v_proj'])"


def loss_of(i: int, step: int) -> float:
    """Run ``i``'s loss at ``step``."""
    return (1 + i % 7 + i / 1000) / (step + 1)


def write_store(folder: Path, runs: int, steps: int = 20) -> tuple[str, Tracker]:
    """``runs`` runs of one experiment, each with a small trainer config as params, its knobs
    tag, a status (``STATUSES`` in turn) and a ``steps``-point loss history (run ``i``'s loss
    is ``loss_of(i, s)``: the lower ``i % 7``, the better, then the lower ``i``); the parent
    stays running. Returns the store's URI and the open Tracker (to write more, then close)."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracker = Tracker(folder / "demo", uri=uri)
    now = int(time.time() * 1000)
    base = {f"setting_{k}": k for k in range(30)}
    for i in range(runs):
        params = dict(base, learning_rate=10.0 ** -(2 + i % 4), output_dir=f"out/runs/run-{i}",
                      peft_config=lora(i), per_device_train_batch_size=4)
        tracker.ensure_run(f"run-{i}", params, {
            "rapidfire.status": STATUSES[i % len(STATUSES)],
            "rapidfire.progress": f"chunk 1/4 (step {steps})",
            "rapidfire.knobs": json.dumps(["learning_rate", "peft_config"])})
        tracker.log_metrics(f"run-{i}", [("loss", loss_of(i, s), s, now + s)
                                         for s in range(1, steps + 1)])
    tracker.experiment_started()
    tracker.flush(timeout=600)
    return uri, tracker
