"""Each run's own MLflow status (the UI's status icon, ``attributes.status`` in a search)
follows its status tag: a run in the rotation RUNNING (as MLflow makes every run, a pending
one too: no write); a stopped one FINISHED (it ended as meant: by a policy or a person); one
deleted or left in the rotation of an experiment that stopped training (interrupted) KILLED;
a resumed or re-run one RUNNING again; a completed one FINISHED, a failed one FAILED, each
ending with its end time; one left pending when a train() call ends SCHEDULED. Each change is
written once, and a run that trains from pending to completed costs no write beyond its end.
Real MLflow on a sqlite store."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from trl_rapidfire.tracking.tags import STATUS_TAG, STOPPED_BY_TAG
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
    assert _status(tracker, "run-0")[0] == "FINISHED"
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


def _tags(tracker, name):
    tracker.flush()
    return MlflowClient(tracker.uri).get_run(tracker.run_id(name)).data.tags


def test_a_stopped_run_is_finished_says_who_stopped_it_and_a_resume_takes_that_back(tracker):
    tracker.ensure_run("run-0", {}, {STATUS_TAG: "running"})
    tracker.set_tags("run-0", {STATUS_TAG: "stopped", STOPPED_BY_TAG: "SuccessiveHalving"})
    tracker.end_run("run-0", "stopped")
    status, ended = _status(tracker, "run-0")
    assert (status, ended is not None) == ("FINISHED", True)
    assert _tags(tracker, "run-0")[STOPPED_BY_TAG] == "SuccessiveHalving"
    tracker.set_tags("run-0", {STATUS_TAG: "running"})  # a person resumed it
    tracker.delete_tag("run-0", STOPPED_BY_TAG)
    assert _status(tracker, "run-0")[0] == "RUNNING"
    tags = _tags(tracker, "run-0")
    assert STOPPED_BY_TAG not in tags and tags[STATUS_TAG] == "running"
    tracker.delete_tag("run-0", STOPPED_BY_TAG)  # not there: nothing to do, no error
    tracker.set_tags("run-0", {STATUS_TAG: "stopped", STOPPED_BY_TAG: "person (tag)"})
    assert _tags(tracker, "run-0")[STOPPED_BY_TAG] == "person (tag)"
    assert _status(tracker, "run-0")[0] == "FINISHED"
    assert tracker.errors == []


def test_a_run_left_pending_is_scheduled_until_its_first_chunk(tracker):
    tracker.ensure_run("run-0", {}, {STATUS_TAG: "pending"})
    tracker.mark_scheduled("run-0")  # queued right after its registration
    tracker.mark_scheduled("run-9")  # never registered: left alone
    status, ended = _status(tracker, "run-0")
    assert (status, ended) == ("SCHEDULED", None)
    tracker.set_tags("run-0", {STATUS_TAG: "running"})  # the next train() trains it
    assert _status(tracker, "run-0")[0] == "RUNNING"
    assert tracker.errors == []
