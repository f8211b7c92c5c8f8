"""What the tests that launch experiment processes share: their environment."""

from __future__ import annotations

import os
from pathlib import Path


def launch_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of an experiment process started by a test: one thread (bitwise
    equality holds at a fixed thread count), offline, a sqlite MLflow store in ``tmp``, and no
    worker record inherited from this process."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}", **extra)
    env.pop("TRL_RAPIDFIRE_WORKER", None)
    return env
