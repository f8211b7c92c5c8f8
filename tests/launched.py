"""What the tests that launch experiment processes share: their environment, and reading back
what the experiments tracked."""

from __future__ import annotations

import os
from pathlib import Path


def launch_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of an experiment process started by a test: one thread (bitwise
    equality holds at a fixed thread count), offline, a sqlite MLflow store in ``tmp`` (unless
    ``extra`` names another), and no worker record inherited from this process."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}")
    env.update(extra)
    env.pop("TRL_RAPIDFIRE_WORKER", None)
    return env


def loss_history(uri: str, experiment: str) -> dict[str, list[tuple[int, float]]]:
    """Every RF run's training-loss points (step, value) in ``experiment`` of the tracking
    store at ``uri`` (a sqlite URI or a server's URL)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    out = {}
    for run in client.search_runs([found.experiment_id]):
        name = run.data.tags.get("rapidfire.run")
        if name:
            history = client.get_metric_history(run.info.run_id, "loss")
            out[name] = sorted((m.step, m.value) for m in history)
    return out
