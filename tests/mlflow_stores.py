"""MLflow stores in the states a crash leaves them (shared by the tracking and CLI tests)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow import MlflowClient

_KILL_MID_CREATION = textwrap.dedent("""
    import os, signal, sys
    import sqlalchemy
    from sqlalchemy import event
    from mlflow import MlflowClient

    # A real kill -9, at a chosen statement of MLflow's schema creation: deterministic.
    @event.listens_for(sqlalchemy.engine.Engine, "after_cursor_execute")
    def _kill(conn, cursor, statement, *args):
        if statement.strip().startswith("CREATE TABLE registered_models"):
            os.kill(os.getpid(), signal.SIGKILL)

    MlflowClient(f"sqlite:///{sys.argv[1]}").search_experiments(max_results=1)
""")


def half_created(db: Path) -> None:
    """Make ``db`` an MLflow store whose creation was killed (kill -9) half-way."""
    proc = subprocess.run([sys.executable, "-c", _KILL_MID_CREATION, str(db)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    # What every later start met before the repair.
    with pytest.raises(Exception, match="already exists"):
        MlflowClient(f"sqlite:///{db}").search_experiments(max_results=1)
