"""Every view says what really happened after an experiment stops training part-way: a run in
the rotation reads "interrupted" (not "running") in MLflow's tags, ``trl-rapidfire status``,
the report's data and the notebook panel's table after a Ctrl-C, a Ctrl-C pressed twice and a
kill -9; the experiment reads killed or not responding, never training; and a re-run sets
every view right again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.cli import main
from trl_rapidfire.reports.experiment_data import load_experiment
from trl_rapidfire.shared_state.runs import INTERRUPTED, RunStatus, shown_status
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

TESTS = Path(__file__).resolve().parents[1]


class _Interrupt(TrainerCallback):
    """At run-1's step ``step``: a Ctrl-C (``hard``: pressed twice, KeyboardInterrupt now).
    Each run has its own copy: the experiment's trainer is the class's, shared."""

    trainer = None

    def __init__(self, step: int, hard: bool = False) -> None:
        self.step, self.hard = step, hard

    def on_step_begin(self, args, state, control, **kwargs):
        if args.output_dir.endswith("run-1") and state.global_step == self.step:
            if self.hard:
                raise KeyboardInterrupt
            self.trainer.engine.interrupted = True  # what the first Ctrl-C's handler sets


def _experiment(out, callbacks=None):
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3, 1e-2]),
                         num_chunks=4, per_device_train_batch_size=4, num_train_epochs=1,
                         logging_steps=1, **{**cpu_training_kwargs(), "report_to": "mlflow"}),
        train_dataset=make_sft_dataset(32, seed=1),
        peft_config=tiny_lora_config(r=4), callbacks=callbacks,
    )
    _Interrupt.trainer = rf
    return rf


def _runs(uri):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "exp"]
    return client.search_runs([exp.experiment_id])


def _tags(uri):
    runs = _runs(uri)
    children = {r.data.tags["rapidfire.run"]: r.data.tags.get("rapidfire.status")
                for r in runs if r.data.tags.get("rapidfire.role") == "run"}
    parent = next(r for r in runs if r.data.tags.get("rapidfire.role") == "experiment")
    return children, parent.info.status


def _mlflow_statuses(uri):
    """Each run's own MLflow status (the UI's status icon, not our tag)."""
    return {r.data.tags["rapidfire.run"]: r.info.status for r in _runs(uri)
            if r.data.tags.get("rapidfire.role") == "run"}


def _status_lines(capsys, out):
    assert main(["status", "--dir", str(out)]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.fixture
def store(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.mark.parametrize("hard", [False, True], ids=["ctrl-c", "ctrl-c-twice"])
def test_after_a_ctrl_c_every_view_says_interrupted_and_a_rerun_sets_them_right(
        tmp_path, store, capsys, hard):
    out = tmp_path / "exp"
    first = _experiment(out, [_Interrupt(3, hard=hard)])
    with pytest.raises(KeyboardInterrupt):
        first.train()
    in_rotation = sorted(r.name for r in first.runs if r.status == RunStatus.RUNNING)
    assert in_rotation  # run-0 and run-1 had trained a chunk
    capsys.readouterr()

    children, parent = _tags(store)
    assert parent == "KILLED"  # not "training" until a heartbeat ages
    assert {n for n, s in children.items() if s == INTERRUPTED} == set(in_rotation)
    # MLflow's own status says the same: no run in the rotation of a stopped experiment shows
    # as running (tests/tracking/test_mlflow_status.py has each transition).
    native = _mlflow_statuses(store)
    assert {n for n, s in native.items() if s == "KILLED"} == set(in_rotation), native
    lines = _status_lines(capsys, out)
    assert "killed" in lines[0], lines
    for name in in_rotation:
        row = next(line for line in lines if line.startswith(name + " "))
        assert INTERRUPTED in row and " running " not in row, row
    data = load_experiment(str(out))
    assert {n for n, r in data.runs.items() if r.status == INTERRUPTED} == set(in_rotation)
    # The notebook panel's table and counts read the same rule.
    assert [shown_status(r.status, training=first.training) for r in first.runs
            if r.name in in_rotation] == [INTERRUPTED] * len(in_rotation)

    _experiment(out).train()  # the re-run trains them to the end
    children, parent = _tags(store)
    assert parent == "FINISHED" and set(children.values()) == {"completed"}
    assert set(_mlflow_statuses(store).values()) == {"FINISHED"}
    lines = _status_lines(capsys, out)
    assert not any(INTERRUPTED in line for line in lines), lines


@pytest.mark.slow
def test_after_a_kill_the_views_say_not_responding_and_interrupted_at_once(tmp_path, store,
                                                                         capsys):
    import signal
    import time

    out = tmp_path / "exp"
    env = dict(os.environ, RF_TEST_ROWS="4000", RF_TEST_REPORT_TO="mlflow",
               MLFLOW_EXPERIMENT_NAME="exp", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, str(TESTS / "experiment_script.py"), str(out)],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # Killed outright (kill -9) once MLflow shows runs training.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                children, parent = _tags(store)
            except Exception:  # noqa: BLE001 - the store or the experiment not made yet
                children, parent = {}, None
            if parent == "RUNNING" and list(children.values()).count("running") >= 2:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the experiment ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = _status_lines(capsys, out)
    # The process on this machine is gone: said now, not after its heartbeat ages (minutes).
    assert "not responding" in lines[0], lines
    running = [n for n, s in children.items() if s == "running"]
    for name in running:
        row = next(line for line in lines if line.startswith(name + " "))
        assert INTERRUPTED in row, lines
    data = load_experiment(str(out))
    assert all(data.runs[n].status == INTERRUPTED for n in running)
