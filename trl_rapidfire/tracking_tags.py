"""The names trl-rapidfire gives MLflow: the tags of its runs and where its store is.

What every reader of a store needs (the CLI, :mod:`.experiments`, :mod:`.experiment_data`)
without the writer (:mod:`.tracking`) or MLflow itself.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "EXPERIMENT_TAG",
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_STALE",
    "HEARTBEAT_TAG",
    "OP_RESULT_TAG",
    "OP_SEQ_TAG",
    "OP_TAG",
    "PROGRESS_TAG",
    "ROLE_TAG",
    "RUN_TAG",
    "STATUS_TAG",
    "check_uri_across_machines",
    "resolve_tracking_uri",
]

OP_TAG = "rapidfire.op"
OP_RESULT_TAG = "rapidfire.op.result"
# How many ops set as tags on this run were answered: a person (or a test) tells their op's
# answer from an earlier one with the same text by this count going up by one.
OP_SEQ_TAG = "rapidfire.op.seq"
RUN_TAG = "rapidfire.run"
EXPERIMENT_TAG = "rapidfire.experiment"
STATUS_TAG = "rapidfire.status"
PROGRESS_TAG = "rapidfire.progress"
ROLE_TAG = "rapidfire.role"
# On the experiment's parent run: the time (Unix seconds) the training process last said it
# was alive. The CLI sends ops to the experiment that is training by it; a process killed
# outright (SIGKILL, a lost machine) leaves the parent "running" with a heartbeat that ages.
HEARTBEAT_TAG = "rapidfire.heartbeat"
HEARTBEAT_INTERVAL = 10.0
# Older than this, a heartbeat is a dead experiment's. Generous: the tracking thread pauses
# while the engine switches runs (loading a large model can take a minute).
HEARTBEAT_STALE = 180.0


def resolve_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def check_uri_across_machines(uri: str, machines: int) -> None:
    """Refuse a tracking store that writers on several machines would corrupt: a sqlite
    database or a file store on a shared filesystem (their locks do not hold across machines
    on NFS and similar). Raises ``RFConfigError`` naming the fix; nothing when ``machines`` is
    1 or the store is a server."""
    if machines <= 1:
        return
    scheme = uri.split(":", 1)[0].lower() if "://" in uri else "file"
    if scheme not in ("sqlite", "file"):
        return
    from .config_errors import RFConfigError

    raise RFConfigError(
        f"report_to='mlflow' with the tracking store {uri!r} under a launch over {machines} "
        "machines: a sqlite or file store written from several machines is not safe. Start a "
        "tracking server on one machine (`mlflow server --backend-store-uri sqlite:///"
        "mlflow.db --host 0.0.0.0 --port 5000`) "
        "and set MLFLOW_TRACKING_URI=http://<that host>:5000 for every machine; or drop "
        "'mlflow' from report_to.")
