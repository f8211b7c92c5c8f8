"""The names trl-rapidfire gives MLflow: the tags of its runs and where its store is.

What every reader of a store needs (the CLI, :mod:`.experiments`, :mod:`.experiment_data`)
without the writer (:mod:`.tracking`) or MLflow itself.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

from ..storage.layout import Layout
from ..storage.own_files import read_json, write_atomic

__all__ = [
    "EXPERIMENT_TAG",
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_STALE",
    "HEARTBEAT_TAG",
    "KNOBS_TAG",
    "OP_RESULT_TAG",
    "OP_SEQ_TAG",
    "OP_TAG",
    "PROCESS_TAG",
    "PROGRESS_TAG",
    "ROLE_TAG",
    "RUN_TAG",
    "STATUS_TAG",
    "STOPPED_BY_TAG",
    "check_uri_across_machines",
    "mlflow_status_of",
    "experiment_id_for",
    "read_experiment_id",
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
# A run's status tag -> the MLflow status its run shows (the UI's status icon, a search's
# ``attributes.status``): a run of an interrupted experiment must not read as still running, nor
# a resumed one as ended. A stopped run ended as it was meant to (a policy's loser, or a
# person's choice; STOPPED_BY_TAG says whose): FINISHED, not the KILLED of a run cut short,
# which MLflow's UI shows in red beside 100 stopped losers. "interrupted" is what views show
# for a run in the rotation of an experiment that stopped training
# (shared_state.runs.INTERRUPTED): it was cut short, KILLED. A pending run is left as MLflow
# makes it (RUNNING) while its experiment trains: making each one SCHEDULED, then RUNNING at
# its first chunk, cost two more writes a run on the tracking thread, whose GIL turns slowed
# the training steps (512 configs: the thread busy 16.4 -> 21.2 s, a step 4.3 -> 4.7 ms). It
# is made SCHEDULED once a train() call ends with it still pending (Tracker.mark_scheduled),
# off the training path.
_MLFLOW_STATUS = {"running": "RUNNING", "interrupted": "KILLED", "stopped": "FINISHED",
                  "deleted": "KILLED", "completed": "FINISHED", "failed": "FAILED"}
# On a stopped run: who stopped it, the policy's name (``SuccessiveHalving``) or
# ``person (<channel>)`` (tag, cli, python); removed when it is resumed.
STOPPED_BY_TAG = "rapidfire.stopped_by"
PROGRESS_TAG = "rapidfire.progress"
ROLE_TAG = "rapidfire.role"
# On each run: its knobs' names (a JSON list), so the control panel's clone form offers the
# run's knobs among the hundreds of params a config logs.
KNOBS_TAG = "rapidfire.knobs"
# On the experiment's parent run: the time (Unix seconds) the training process last said it
# was alive. The CLI sends ops to the experiment that is training by it; a process killed
# outright (SIGKILL, a lost machine) leaves the parent "running" with a heartbeat that ages.
HEARTBEAT_TAG = "rapidfire.heartbeat"
HEARTBEAT_INTERVAL = 10.0
# Older than this, a heartbeat is a dead experiment's. Generous: the tracking thread pauses
# while the engine switches runs (loading a large model can take a minute).
HEARTBEAT_STALE = 180.0
# On the parent run too: ``<host>:<pid>`` of the process that trains it. On that host the CLI
# asks the process itself, so a kill -9 reads "not responding" at once, not after a stale beat.
PROCESS_TAG = "rapidfire.process"


def read_experiment_id(path: str | os.PathLike) -> str:
    """The experiment's id in its marker file ``path`` (``.rapidfire/experiment.json``).

    Raises:
        FileNotFoundError: there is no marker.
        ValueError: the file is damaged, a link, or holds no id. The id is hex, nothing else:
            it goes into MLflow search filters, where other text could change the query.
    """
    doc = read_json(path, max_depth=2)
    value = doc.get("id") if isinstance(doc, dict) else None
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{8,64}", value):
        raise ValueError(f"{path} holds {value!r}, not an experiment id (hex)")
    return value


def experiment_id_for(output_dir: str | os.PathLike) -> str:
    """The experiment's id, created once and kept in ``<output_dir>/.rapidfire/``."""
    path = Layout(output_dir).experiment_marker
    if not os.path.lexists(path):
        write_atomic(path, json.dumps({"id": uuid.uuid4().hex}))
    return read_experiment_id(path)


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
    from ..config.errors import RFConfigError

    raise RFConfigError(
        f"report_to='mlflow' with the tracking store {uri!r} under a launch over {machines} "
        "machines: a sqlite or file store written from several machines is not safe. Start a "
        "tracking server on one machine (`mlflow server --backend-store-uri sqlite:///"
        "mlflow.db --host 0.0.0.0 --port 5000`) "
        "and set MLFLOW_TRACKING_URI=http://<that host>:5000 for every machine; or drop "
        "'mlflow' from report_to.")


def mlflow_status_of(status: str | None) -> str | None:
    """The MLflow run status for a run whose status tag is ``status`` (``None``: not one of
    ours, left as it is)."""
    return _MLFLOW_STATUS.get(status or "")
