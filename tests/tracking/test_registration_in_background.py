"""Runs are registered on the tracking thread, not on the way to the first chunk (issue 46): a
Tracker returns without waiting for MLflow (its import, a new store's schema, the experiment,
the parent run) and ``ensure_run`` only queues. What the tests hold to:

- construction and registration make no MLflow call on the caller's thread and return before
  the runs exist; after ``flush()`` every run is there exactly once, with its params and tags;
- points, tags and ends queued before a run exists land on that run once it does;
- a process killed mid-registration, then a re-run (two workers at once) registering every run:
  one MLflow run per RF run, with all its params;
- two trackers registering the same runs at the same time make each run once.

Real MLflow on sqlite stores in ``tmp_path``; the subprocesses import the tracker only (no
training stack): what is under test is the registration, not a trainer.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import mlflow
import pytest
from filelock import FileLock
from mlflow import MlflowClient

from trl_rapidfire.tracking.tags import (
    EXPERIMENT_TAG,
    ROLE_TAG,
    RUN_TAG,
    STATUS_TAG,
    experiment_id_for,
)
from trl_rapidfire.tracking.tracker import Tracker

FAST = dict(poll_interval=0.05, write_interval=0.1)
TRACKING_THREAD = "rapidfire-tracking"


def _params(i: int, count: int = 30) -> dict:
    return {"learning_rate": 1e-4 * (i + 1), **{f"field_{k}": f"v{k}" for k in range(count - 1)}}


def _children(uri: str, output_dir: Path) -> dict[str, list]:
    """Every child run of the experiment in ``output_dir``, by RF run name (a list: the tests
    look for duplicates)."""
    client = MlflowClient(uri)
    flt = (f"tags.`{ROLE_TAG}` = 'run' and "
           f"tags.`{EXPERIMENT_TAG}` = '{experiment_id_for(output_dir)}'")
    found: dict[str, list] = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], filter_string=flt, max_results=5000):
            found.setdefault(run.data.tags[RUN_TAG], []).append(run)
    return found


class _Recording(MlflowClient):
    """A real MlflowClient that records which thread calls each of its public methods."""

    calls: list[tuple[str, str]] = []

    def __getattribute__(self, name: str):
        value = super().__getattribute__(name)
        if not name.startswith("_") and callable(value):
            _Recording.calls.append((name, threading.current_thread().name))
        return value


def test_construction_and_registration_return_before_mlflow_and_flush_makes_every_run(
        tmp_path, monkeypatch):
    monkeypatch.setattr(mlflow, "MlflowClient", _Recording)  # what the tracker imports
    _Recording.calls = []
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "exp"
    (out / ".rapidfire").mkdir(parents=True)
    # The setup lock held here (the same object: the tracker's is a singleton) keeps the
    # tracking thread from making the experiment, so "before" is certain, not a race.
    setup_lock = FileLock(str(out / ".rapidfire" / "tracking.lock"), is_singleton=True)
    names = [f"run-{i}" for i in range(40)]  # more than one batch (32)
    with setup_lock:
        tracker = Tracker(out, uri=uri, **FAST)
        for i, name in enumerate(names):
            tracker.ensure_run(name, _params(i), {STATUS_TAG: "pending",
                                                  "rapidfire.knobs": f'["lr{i}"]'})
        # Queued before any run exists: a first run's and a second batch's run's points,
        # tags and ends.
        for name, value in (("run-5", 5.0), ("run-37", 37.0)):
            tracker.log_metrics(name, [("loss", value, 1, 1000), ("loss", value + 1, 2, 2000)])
            tracker.set_tags(name, {"rapidfire.progress": f"{name} chunk 1/4"})
        tracker.end_run("run-38", "completed")
        assert tracker.uri == uri and tracker.experiment_name == "exp"  # there at once
        assert not [c for c in _Recording.calls if c[0] == "create_run"]
    tracker.flush(timeout=120)
    tracker.close()

    assert {thread for _, thread in _Recording.calls} == {TRACKING_THREAD}, _Recording.calls
    children = _children(uri, out)
    assert sorted(children) == sorted(names)
    client = MlflowClient(uri)
    for i, name in enumerate(names):
        (run,) = children[name]  # exactly one
        assert run.data.params == {k: str(v) for k, v in _params(i).items()}
        assert run.data.tags["rapidfire.knobs"] == f'["lr{i}"]'
        assert run.data.tags["mlflow.parentRunId"] == tracker.parent_run_id
        history = client.get_metric_history(run.info.run_id, "loss")
        if name in ("run-5", "run-37"):
            value = float(name.split("-")[1])
            assert sorted((m.step, m.value) for m in history) == [(1, value), (2, value + 1)]
            assert run.data.tags["rapidfire.progress"] == f"{name} chunk 1/4"
        else:
            assert history == []
        assert run.info.status == ("FINISHED" if name == "run-38" else "RUNNING")
        assert run.data.tags[STATUS_TAG] == "pending"
    assert not tracker.errors


def test_a_run_asked_for_its_id_is_made_first(tmp_path):
    tracker = Tracker(tmp_path / "exp", uri=f"sqlite:///{tmp_path / 'mlflow.db'}", **FAST)
    try:
        tracker.ensure_run("run-0", {"lr": 1}, {})
        run_id = tracker.run_id("run-0")  # waits for (or does) the creation
        assert MlflowClient(tracker.uri).get_run(run_id).data.params == {"lr": "1"}
        with pytest.raises(KeyError):
            tracker.run_id("run-9")  # never registered
    finally:
        tracker.close()


_REGISTER = textwrap.dedent("""
    import os, sqlite3, sys, time
    from pathlib import Path
    from trl_rapidfire.tracking.tracker import Tracker

    out, uri, n, kill_after = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tracker = Tracker(out, uri=uri, poll_interval=0.05, write_interval=0.1)
    for i in range(n):
        params = {"learning_rate": 1e-4 * (i + 1), **{f"field_{k}": f"v{k}" for k in range(29)}}
        tracker.ensure_run(f"run-{i}", params, {"rapidfire.status": "pending"})
    if kill_after:
        # Killed (no flush, no atexit) once the thread has made some runs, not all.
        db = uri[len("sqlite:///"):]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with sqlite3.connect(db, timeout=0.01) as con:
                    made = con.execute(
                        "SELECT COUNT(*) FROM tags WHERE key = 'rapidfire.role' "
                        "AND value = 'run'").fetchone()[0]
            except sqlite3.Error:
                made = 0
            if made >= kill_after:
                os._exit(9)
            time.sleep(0.002)
        os._exit(3)
    tracker.close()
    print("ERRORS", tracker.errors)
    sys.exit(1 if tracker.errors else 0)
""")


def _register(out: Path, uri: str, n: int, kill_after: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _REGISTER, str(out), uri, str(n),
                             str(kill_after)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_a_process_killed_mid_registration_then_two_workers_rerun_one_mlflow_run_each(tmp_path):
    uri, out, n = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "exp", 40
    killed = _register(out, uri, n, kill_after=4)
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == 9, err[-3000:]
    before = _children(uri, out)
    assert 4 <= len(before) < n, sorted(before)  # some runs made, not all
    # The re-run: two workers of a launch register every run at the same time.
    workers = [_register(out, uri, n) for _ in range(2)]
    for worker in workers:
        stdout, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, (stdout + err)[-3000:]
    children = _children(uri, out)
    assert sorted(children) == sorted(f"run-{i}" for i in range(n))
    for i in range(n):
        (run,) = children[f"run-{i}"]  # exactly one, whoever made it
        assert run.data.params == {k: str(v) for k, v in _params(i).items()}
        assert run.data.tags[STATUS_TAG] == "pending"
    with sqlite3.connect(tmp_path / "mlflow.db") as con:  # one parent run too
        assert con.execute("SELECT COUNT(*) FROM tags WHERE key = 'rapidfire.role' AND "
                           "value = 'experiment'").fetchone()[0] == 1


def test_two_trackers_registering_the_same_runs_at_once_make_each_run_once(tmp_path):
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "exp"
    names = [f"run-{i}" for i in range(24)]
    trackers = [Tracker(out, uri=uri, **FAST) for _ in range(2)]
    start = threading.Barrier(2)

    def register(tracker: Tracker) -> None:
        start.wait()
        for i, name in enumerate(names):
            tracker.ensure_run(name, _params(i, 10), {})
            time.sleep(0.001)  # as an engine between two builds: the batches interleave
        tracker.flush(timeout=120)

    threads = [threading.Thread(target=register, args=(t,)) for t in trackers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        children = _children(uri, out)
        assert {name: len(runs) for name, runs in children.items()} == dict.fromkeys(names, 1)
        for name in names:
            assert trackers[0].run_id(name) == trackers[1].run_id(name)
        assert trackers[0].parent_run_id == trackers[1].parent_run_id
        assert not trackers[0].errors and not trackers[1].errors
    finally:
        for tracker in trackers:
            tracker.close()


def test_a_store_that_opens_late_gets_every_run_and_point_queued_meanwhile(tmp_path,
                                                                          monkeypatch):
    """The store fails to open at first (a server not up yet): nothing is lost, the failure
    is said once, and the next attempt (``retry_after`` later) makes the runs and writes the
    points that waited."""
    from trl_rapidfire.tracking import tracker as tracker_module

    real_open, attempts = tracker_module.open_connection, []

    def not_up_at_first(*args, **kwargs):
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise ConnectionError("the server is not up yet")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(tracker_module, "open_connection", not_up_at_first)
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "exp"
    tracker = Tracker(out, uri=uri, **FAST)
    for i in range(3):
        tracker.ensure_run(f"run-{i}", {"lr": i}, {})
        tracker.log_metrics(f"run-{i}", [("loss", float(i), 1, 1000)])
    tracker.flush()
    assert tracker.errors == ["ConnectionError: the server is not up yet"]
    time.sleep(1.1)  # retry_after: max(write_interval, 1 s)
    tracker.flush()
    tracker.close()
    assert len(attempts) == 2 and tracker.errors == ["ConnectionError: the server is not up yet"]
    children = _children(uri, out)
    client = MlflowClient(uri)
    for i in range(3):
        (run,) = children[f"run-{i}"]
        assert run.data.params == {"lr": str(i)}
        assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == [i]


def test_a_run_mlflow_refuses_does_not_hold_up_the_runs_after_it(tmp_path):
    """Registering run-0 fails (MLflow refuses a param key): it is said once and tried again
    later, and the runs registered after it are made and get their points meanwhile."""
    from trl_rapidfire.tracking.mlflow_store import TrackingStoreError

    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "exp"
    tracker = Tracker(out, uri=uri, **FAST)
    try:
        tracker.ensure_run("run-0", {"bad*key": 1}, {})
        for i in range(1, 4):
            tracker.ensure_run(f"run-{i}", {"lr": i}, {})
            tracker.log_metrics(f"run-{i}", [("loss", float(i), 1, 1000)])
        tracker.flush()
        time.sleep(1.1)
        tracker.flush()  # run-0 tried again: refused again, not said again
        refusals = [e for e in tracker.errors if "bad*key" in e]
        assert len(refusals) == 1 and refusals[0].startswith("registering run-0: "), tracker.errors
        with pytest.raises(TrackingStoreError, match="bad"):
            tracker.run_id("run-0")
        client = MlflowClient(uri)
        for i in range(1, 4):
            history = client.get_metric_history(tracker.run_id(f"run-{i}"), "loss")
            assert [m.value for m in history] == [i]
    finally:
        tracker.close()


def test_run_trainers_are_built_without_mlflows_callback(tmp_path, monkeypatch):
    # The engine tracks the runs itself: a run's trainer built with MLflow's callback (removed
    # at once) imported mlflow on the way to the first chunk. Its config reads as written.
    from transformers.integrations import MLflowCallback

    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    made = []
    original = MLflowCallback.__init__

    def counted(self, *args, **kwargs):
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(MLflowCallback, "__init__", counted)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    kwargs = {**cpu_training_kwargs(), "report_to": ["mlflow", "tensorboard"]}
    rf = RFSFTTrainer(
        model=tiny_model_path(), train_dataset=make_sft_dataset(8),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List([1e-3, 1e-2]),
                         per_device_train_batch_size=4, **kwargs),
        peft_config=tiny_lora_config(r=4))
    assert made == []
    for run in ("run-0", "run-1"):
        trainer = rf.run_trainer(run)
        assert list(trainer.args.report_to) == ["mlflow", "tensorboard"]
        names = {type(cb).__name__ for cb in trainer.callback_handler.callbacks}
        assert "TensorBoardCallback" in names and "MLflowCallback" not in names
    rf.engine.tracker.close()
