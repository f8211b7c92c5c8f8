"""MLflow's saved view of the runs table (``client/mlflow_view.py``) is sorted by the
experiment's ranking metric, best first, and is set on every experiment the project makes: by
``trl-rapidfire dashboard`` for those in the store when it starts and for each new one while it
serves, and by the panel's page through the panel's read-only ``/api/view``. In MLflow's own UI
(Chromium) the runs are then listed best first. Stores written by the Tracker (no training)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from browser import chromium
from dashboard_process import Dashboard
from flask import Flask
from mlflow import MlflowClient
from mlflow_server import free_port

from trl_rapidfire.client.mlflow_view import (
    SETTLED,
    VIEW_TAG,
    ensure_all_views,
    runs_view_state,
    view_answer,
)
from trl_rapidfire.client.panel_runs import RunsQuery
from trl_rapidfire.reports.ranking import RANKING_TAG, RankingMetric
from trl_rapidfire.tracking.tracker import Tracker

ACCURACY = RankingMetric("eval_accuracy", True, "metric_for_best_model")


def _experiment(folder: Path, uri: str, name: str, runs: int = 12) -> str:
    """An experiment of ``runs`` runs ranked by eval_accuracy (higher first); run ``i``'s is
    ``(i * 5) % runs / runs``. Returns its trl-rapidfire id."""
    tracker = Tracker(folder / name, uri=uri, write_interval=0.05)
    now = int(time.time() * 1000)
    for i in range(runs):
        tracker.ensure_run(f"run-{i}", {"learning_rate": 10.0 ** -(1 + i % 4),
                                        "output_dir": f"{name}/runs/run-{i}"},
                           {"rapidfire.knobs": json.dumps(["learning_rate"]),
                            RANKING_TAG: ACCURACY.to_text(), "rapidfire.status": "completed"})
        tracker.log_metrics(f"run-{i}", [("loss", 1.0, 1, now),
                                         ("eval_accuracy", (i * 5) % runs / runs, 1, now)])
    tracker.flush()
    tracker.close()
    return tracker.rf_experiment


def _state(client: MlflowClient, experiment_id: str) -> dict | None:
    tag = client.get_experiment(experiment_id).tags.get(VIEW_TAG)
    return None if tag is None else json.loads(json.loads(tag)["state"])


def _experiment_id(client: MlflowClient, name: str) -> str:
    return client.get_experiment_by_name(name).experiment_id


def test_the_view_is_sorted_by_the_ranking_metric_best_first():
    state = runs_view_state(["learning_rate"], ACCURACY)
    assert state["orderByKey"] == "metrics.`eval_accuracy`" and state["orderByAsc"] is False
    assert state["columnOrder"][:3] == ["params.`learning_rate`", "tags.`rapidfire.status`",
                                        "tags.`rapidfire.progress`"]
    assert "metrics.`eval_accuracy`" in state["selectedColumns"]
    assert runs_view_state([])["orderByKey"] == "metrics.`loss`"  # no ranking: the loss


def test_every_experiment_gets_the_view_and_the_panel_computes_the_same(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = _experiment(tmp_path, uri, "first")
    _experiment(tmp_path, uri, "second", runs=6)
    client = MlflowClient(uri)
    from trl_rapidfire.client.experiments import list_experiments

    done: dict[str, int] = {}
    ensure_all_views(client, list_experiments(uri=uri), done)
    assert sorted(done.values()) == [6, 12]  # runs found: looked at again next time
    for name in ("first", "second"):
        state = _state(client, _experiment_id(client, name))
        assert state["orderByKey"] == "metrics.`eval_accuracy`" and not state["orderByAsc"]
        assert state["columnOrder"][0] == "params.`learning_rate`"
    # The same runs at the next look: settled, and the view written once (it keeps its
    # creation time).
    tag = client.get_experiment(_experiment_id(client, "first")).tags[VIEW_TAG]
    ensure_all_views(client, list_experiments(uri=uri), done)
    assert set(done.values()) == {SETTLED}
    assert client.get_experiment(_experiment_id(client, "first")).tags[VIEW_TAG] == tag
    # The panel's route (it only reads) gives the state the dashboard wrote.
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(uri, str(tmp_path / "artifacts"))
    answer = view_answer(store, RunsQuery(_experiment_id(client, "first"), first, None))
    assert answer["key"] == VIEW_TAG
    assert json.loads(answer["state"]) == _state(client, _experiment_id(client, "first"))
    assert json.loads(json.loads(answer["value"])["state"]) == json.loads(answer["state"])
    app = Flask("view-route")
    from trl_rapidfire.client.panel_app import create_app

    create_app(app, store=store)
    reply = app.test_client().get("/rapidfire/api/view", query_string={
        "experiment": _experiment_id(client, "first"), "rfid": first})
    assert reply.status_code == 200 and reply.get_json()["state"] == answer["state"]


@pytest.mark.slow
def test_the_dashboard_sets_the_view_on_an_experiment_made_while_it_serves(tmp_path):
    from selenium.webdriver.common.by import By

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _experiment(tmp_path, uri, "before")
    port = free_port()
    dash = Dashboard(["--port", str(port), "--uri", uri], tmp_path, tmp_path / "dashboard.log")
    try:
        dash.url()
        _experiment(tmp_path, uri, "after")  # trained while the dashboard serves
        client = MlflowClient(uri)
        deadline = time.monotonic() + 60
        while _state(client, _experiment_id(client, "after")) is None:
            assert time.monotonic() < deadline, "no view on the new experiment"
            time.sleep(1)
        assert _state(client, _experiment_id(client, "after"))["orderByKey"] == \
            "metrics.`eval_accuracy`"
        # In MLflow's UI the view lists the runs best first by the metric.
        from trl_rapidfire.client.mlflow_view import runs_url

        with chromium(1600, 900) as driver:
            driver.get(runs_url(f"http://127.0.0.1:{port}", _experiment_id(client, "after")))
            deadline = time.monotonic() + 120
            while True:
                # The run's name is in the row's pinned left part or its centre (MLflow's
                # versions differ): the rows' words in row order, each run named once.
                rows = sorted(((int(r.get_attribute("row-index")), r.text)
                               for r in driver.find_elements(By.CSS_SELECTOR,
                                                             ".ag-row[row-index]")),
                              key=lambda x: x[0])
                names = list(dict.fromkeys(w for _, t in rows for w in t.split()
                                           if w.startswith("run-")))
                if len(names) >= 12 or time.monotonic() > deadline:
                    break
                time.sleep(1)
            want = sorted(range(12), key=lambda i: (-((i * 5) % 12), i))
            assert names[:12] == [f"run-{i}" for i in want], names
    finally:
        dash.proc.send_signal(signal.SIGINT)
        try:
            assert dash.proc.wait(timeout=120) == 0
        finally:
            dash.close()
