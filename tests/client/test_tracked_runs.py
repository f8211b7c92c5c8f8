"""The CLI's readers of an MLflow store (tracked_runs.py) answer exactly as MlflowClient does:
its sqlite tables read directly, a real `mlflow server` through REST, and the tag they write
is the one MLflow then reads."""

from __future__ import annotations

import math
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow_server import mlflow_server

from trl_rapidfire.client.tracked_runs import (
    ClientCatalog,
    RestCatalog,
    SqliteCatalog,
    open_catalog,
    sqlite_ready,
)
from trl_rapidfire.tracking.mlflow_store import TrackingStoreError


def _fill(uri: str) -> None:
    """Two experiments (and a deleted one), runs with tags and metrics (a NaN, steps out of
    order), a deleted run: what the readers must tell apart."""
    client = MlflowClient(uri)
    for name in ("alpha", "beta", "gone"):
        exp = client.create_experiment(name)
        for i in range(3):
            run = client.create_run(exp, start_time=1_000 + 10 * i,
                                    tags={"rapidfire.role": "run", "rapidfire.run": f"run-{i}",
                                          "rapidfire.experiment": f"{name}0123456789"})
            client.log_batch(run.info.run_id, metrics=[
                Metric("loss", 2.0 - i, 0, 5), Metric("loss", 9.0, 0, 1),
                Metric("eval_loss", math.nan if i == 1 else 0.5 * i, 0, 3)],
                params=[Param("learning_rate", str(10.0 ** -i)), Param("note", "it's")],
                tags=[RunTag("note", "it's")])  # a quote in a value read back
            if i == 2:
                client.set_terminated(run.info.run_id, "FAILED")
        parent = client.create_run(exp, start_time=5_000, tags={
            "rapidfire.role": "experiment", "rapidfire.experiment": f"{name}0123456789"})
        client.delete_run(client.create_run(exp, tags={"rapidfire.role": "run"}).info.run_id)
        assert parent
    client.delete_experiment(client.get_experiment_by_name("gone").experiment_id)


def _same(got, want) -> None:
    """TrackedRun lists equal, NaN metrics included (NaN != NaN in a dataclass compare)."""
    def key(run):
        return (run.run_id, run.experiment_id, run.status, run.start_time, dict(run.tags),
                {k: "nan" if math.isnan(v) else v for k, v in run.metrics.items()},
                dict(run.params))

    assert [key(r) for r in got] == [key(r) for r in want]


def _compare(fast, client: ClientCatalog) -> None:
    assert fast.experiment_names() == client.experiment_names()
    for name in ("alpha", "beta", "gone", "nope"):
        assert fast.experiment_id(name) == client.experiment_id(name)
    ids = list(client.experiment_names())
    for tags in ({}, {"rapidfire.role": "run"}, {"rapidfire.role": "experiment"},
                 {"rapidfire.role": "run", "rapidfire.run": "run-1"},
                 {"rapidfire.role": "run", "rapidfire.experiment": "beta0123456789"},
                 {"rapidfire.run": "run-9"}):
        got, want = fast.runs(ids, tags), client.runs(ids, tags)
        assert want or tags.get("rapidfire.run") == "run-9"
        _same(got, want)
    assert fast.runs([], {}) == []


def _filled_and_compared(uri: str, kind: type):
    """The store filled, the fast reader of its kind checked against MlflowClient's answers;
    returns both and the first run named ``run-1``."""
    _fill(uri)
    fast = open_catalog(uri)
    assert isinstance(fast, kind)
    client = ClientCatalog(uri)
    _compare(fast, client)
    run = client.runs(list(client.experiment_names()), {"rapidfire.run": "run-1"})[0]
    return fast, run


def test_the_sqlite_reader_answers_as_mlflow_does_and_its_tag_is_mlflows(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fast, run = _filled_and_compared(uri, SqliteCatalog)
    assert math.isnan(run.metrics["eval_loss"]) and run.metrics["loss"] == 1.0  # latest step
    mine = fast.runs([run.experiment_id], {"rapidfire.run": "run-1"})[0]
    assert mine.params == {"learning_rate": "0.1", "note": "it's"}  # status's knob columns
    fast.set_tag(run.run_id, "rapidfire.op", "stop")
    fast.set_tag(run.run_id, "rapidfire.op", 'clone {"learning_rate": 0.1}')  # replaced
    assert MlflowClient(uri).get_run(run.run_id).data.tags["rapidfire.op"] == (
        'clone {"learning_rate": 0.1}')
    with pytest.raises(ValueError, match="at most 8000"):
        fast.set_tag(run.run_id, "rapidfire.op", "x" * 8001)
    deleted = MlflowClient(uri).search_runs(
        [run.experiment_id], "tags.`rapidfire.role` = 'run'", run_view_type=2)  # DELETED_ONLY
    with pytest.raises(LookupError, match="deleted"):
        fast.set_tag(deleted[0].info.run_id, "rapidfire.op", "stop")


def test_a_store_mlflow_must_create_or_upgrade_is_left_to_mlflow(tmp_path):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    _fill(uri)
    assert sqlite_ready(db)
    with sqlite3.connect(db) as con:  # what an older MLflow left: its revision behind ours
        con.execute("UPDATE alembic_version SET version_num = '0584bdc529eb'")
    assert not sqlite_ready(db)
    assert isinstance(open_catalog(uri), ClientCatalog)
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "text.db").write_text("not a database")
    assert not sqlite_ready(tmp_path / "empty.db") and not sqlite_ready(tmp_path / "text.db")
    assert not sqlite_ready(tmp_path / "missing.db")


@pytest.mark.slow
def test_the_rest_reader_answers_as_mlflow_does_through_a_real_server(tmp_path):
    with mlflow_server(tmp_path / "mlflow.db") as url:
        fast, run = _filled_and_compared(url, RestCatalog)
        fast.set_tag(run.run_id, "rapidfire.op", "resume")
        assert MlflowClient(url).get_run(run.run_id).data.tags["rapidfire.op"] == "resume"
        with pytest.raises(LookupError, match="not found"):
            fast.set_tag("0" * 32, "rapidfire.op", "stop")
        with pytest.raises(TrackingStoreError, match=r"refused runs/set-tag \(HTTP 400\)"):
            fast.set_tag(run.run_id, "a*b", "x")  # a key MLflow's own validation refuses


@pytest.mark.slow
def test_the_cli_startup_benchmark_prints_its_ratios(tmp_path):
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "cli_startup.py"),
                           "--quick"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(root)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = dict(re.findall(r"^(--help|status|stop run-1|MlflowClient \(baseline\)) +"
                           r"[0-9.]+ +([0-9.]+)$", proc.stdout, re.M))
    assert set(rows) == {"--help", "status", "stop run-1", "MlflowClient (baseline)"}, (
        proc.stdout)
    assert float(rows["MlflowClient (baseline)"]) == 1.0
