"""Each run's own MLflow status (the UI's status icon, ``attributes.status`` in a search)
follows its status tag: a run in the rotation RUNNING (as MLflow makes every run, a pending
one too: no write); one stopped, deleted or left in the rotation of an experiment that stopped
training (interrupted) KILLED; a resumed or re-run one RUNNING again; a completed one
FINISHED, a failed one FAILED, each ending with its end time. Each change is written once,
and a run that trains from pending to completed costs no write beyond its end. Real MLflow on
a sqlite store."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from trl_rapidfire.tracking.tags import STATUS_TAG
from trl_rapidfire.tracking.tracker import Tracker

FAST = dict(poll_interval=0.05, write_interval=0.1)


@pytest.fixture
def tracker(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(tmp_path / "exp", uri=uri, **FAST)
    yield tracker
    tracker.close()


def _status(tracker, name):
    tracker.flush()
    info = MlflowClient(tracker.uri).get_run(tracker.run_id(name)).info
    return info.status, info.end_time


def test_a_runs_mlflow_status_follows_its_status_tag_through_its_life(tracker):
    tracker.ensure_run("run-0", {"learning_rate": 1e-3}, {STATUS_TAG: "pending"})
    assert _status(tracker, "run-0") == ("RUNNING", None)
    tracker.set_tags("run-0", {STATUS_TAG: "running"})
    assert _status(tracker, "run-0")[0] == "RUNNING"
    tracker.set_tags("run-0", {STATUS_TAG: "interrupted"})  # the experiment's Ctrl-C
    status, ended = _status(tracker, "run-0")
    assert status == "KILLED" and ended is not None
    tracker.set_tags("run-0", {STATUS_TAG: "running"})  # the re-run trains it again
    assert _status(tracker, "run-0")[0] == "RUNNING"
    tracker.set_tags("run-0", {STATUS_TAG: "stopped"})
    tracker.end_run("run-0", "stopped")
    assert _status(tracker, "run-0")[0] == "KILLED"
    tracker.set_tags("run-0", {STATUS_TAG: "running"})  # resumed
    assert _status(tracker, "run-0")[0] == "RUNNING"
    tracker.set_tags("run-0", {STATUS_TAG: "completed"})
    tracker.end_run("run-0", "completed")
    status, ended = _status(tracker, "run-0")
    assert status == "FINISHED" and ended is not None


def test_a_failed_run_fails_and_a_run_created_running_is_left_running(tracker):
    tracker.ensure_run("run-0", {}, {STATUS_TAG: "running"})
    tracker.ensure_run("run-1", {}, {STATUS_TAG: "pending"})
    assert _status(tracker, "run-0")[0] == "RUNNING"
    tracker.set_tags("run-1", {STATUS_TAG: "failed"})
    tracker.end_run("run-1", "failed")
    assert _status(tracker, "run-1")[0] == "FAILED"


def test_a_status_is_written_once_and_the_common_path_writes_none(tracker, monkeypatch):
    tracker.ensure_run("run-0", {}, {STATUS_TAG: "pending"})
    tracker.flush()
    writes = []
    client = MlflowClient

    def counted(name):
        real = getattr(client, name)

        def call(self, *args, **kwargs):
            writes.append(name)
            return real(self, *args, **kwargs)
        return call

    for name in ("update_run", "set_terminated"):
        monkeypatch.setattr(client, name, counted(name))
    for _ in range(3):  # a report at each chunk end repeats the tag: MLflow has it already
        tracker.set_tags("run-0", {STATUS_TAG: "running"})
        tracker.flush()
    assert writes == []
    tracker.set_tags("run-0", {STATUS_TAG: "interrupted"})
    tracker.flush()
    for _ in range(3):  # the re-run's reports: RUNNING again, once
        tracker.set_tags("run-0", {STATUS_TAG: "running"})
        tracker.flush()
    assert writes == ["set_terminated", "update_run"]
    assert _status(tracker, "run-0")[0] == "RUNNING"
