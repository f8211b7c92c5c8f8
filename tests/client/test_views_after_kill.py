"""Views after a kill -9: the dashboard's panel server tells a training process on its machine
that is gone at once, by the CLI's own rule (``experiments.experiment_state``), though MLflow
keeps the experiment RUNNING with a fresh heartbeat; ``status`` takes the folder's state where
MLflow lags it; and a bad query is a JSON 400 naming its parameter, never a server error."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from flask import Flask
from mlflow.entities import RunTag
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from tests.client.panel_store import write_store
from trl_rapidfire.client.experiments import experiment_state
from trl_rapidfire.client.panel_app import create_app
from trl_rapidfire.client.status import ahead_of_mlflow
from trl_rapidfire.shared_state.runs import RunState, RunStatus


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def written(tmp_path):
    uri, tracker = write_store(tmp_path, 4, 3)
    store = SqlAlchemyStore(uri, str(tmp_path / "artifacts"))
    (experiment,) = [e for e in store.search_experiments() if e.name == "demo"]
    (parent,) = store.search_runs([experiment.experiment_id],
                                  "tags.`rapidfire.role` = 'experiment'", 1, 10)
    yield store, experiment.experiment_id, parent
    tracker.close(parent_status=None)


def _runs(store, experiment, rfid, **extra):
    app = Flask("views-after-kill")
    create_app(app, store=store)
    reply = app.test_client().post("/rapidfire/api/runs",
                                   json={"experiment": experiment, "rfid": rfid, **extra})
    return reply.status_code, reply.get_json()


def test_the_panel_server_tells_a_killed_process_at_once_as_the_cli_does(written):
    store, experiment, parent = written
    rfid = parent.data.tags["rapidfire.experiment"]
    status, alive = _runs(store, experiment, rfid)
    assert status == 200 and "state" not in alive  # training: the page's heartbeat says so
    assert {r["shown"] for r in alive["runs"]} >= {"running"}

    # kill -9: MLflow keeps RUNNING and the heartbeat is still fresh; the pid is gone.
    store.set_tag(parent.info.run_id, RunTag("rapidfire.process",
                                             f"{socket.gethostname()}:{_dead_pid()}"))
    status, killed = _runs(store, experiment, rfid)
    fresh = store.get_run(parent.info.run_id)
    assert fresh.info.status == "RUNNING"
    assert killed["state"] == experiment_state(fresh.info.status, fresh.data.tags)[0]
    assert killed["state"] == "not responding"
    shown = {r["name"]: r["shown"] for r in killed["runs"]}
    assert "running" not in shown.values() and "interrupted" in shown.values(), shown


@pytest.mark.parametrize("experiment", ["1" * 30, "9223372036854775808"])
def test_an_experiment_id_past_the_stores_integers_is_a_json_400(written, experiment):
    store, _, parent = written
    app = Flask("views-after-kill")
    create_app(app, store=store)
    rfid = parent.data.tags["rapidfire.experiment"]
    reply = app.test_client().get(f"/rapidfire/api/runs?experiment={experiment}&rfid={rfid}")
    assert reply.status_code == 400 and reply.mimetype == "application/json"
    assert "'experiment'" in json.loads(reply.data)["error"]


def test_status_takes_the_folder_where_mlflow_lags_it():
    trained = RunState("run-0", status=RunStatus.RUNNING, chunks_done=4, global_step=8)
    # MLflow never got past "pending" (its writes queued when the process was killed).
    assert ahead_of_mlflow("pending", "-", trained) == ("running", "chunk 4 (step 8)")
    assert ahead_of_mlflow("running", "chunk 2/6 (epoch 1/1, step 4/12)", trained) == (
        "running", "chunk 4/6 (step 8)")
    # Where MLflow is as far as the folder, or there is no folder, MLflow's words stay.
    assert ahead_of_mlflow("running", "chunk 4/6 (epoch 1/1, step 8/12)", trained) == (
        "running", "chunk 4/6 (epoch 1/1, step 8/12)")
    assert ahead_of_mlflow("pending", "-", None) == ("pending", "-")
