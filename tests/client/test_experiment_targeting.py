"""Which experiment the CLI acts on, and how an experiment's parent run ends: a real sqlite
store, real (tiny) training, the CLI called as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.client.cli import main
from trl_rapidfire.client.experiments import find_experiment
from trl_rapidfire.engine import RunFailure
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)
from trl_rapidfire.tracking.tracker import HEARTBEAT_TAG, Tracker

BASE = dict(cpu_training_kwargs(), per_device_train_batch_size=4, report_to="mlflow")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


def _trainer(out, callbacks=None, lrs=(1e-3, 3e-3), **kw):
    args = dict(BASE, num_chunks=2, max_steps=4)
    args.update(kw)
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(list(lrs)), **args),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
        callbacks=callbacks,
    )


def _parent(trainer):
    tracker = trainer.engine.tracker
    tracker.flush()
    return tracker.client.get_run(tracker.parent_run_id)


class _At(TrainerCallback):
    """Calls ``action(trainer)`` once, at the first step end of the run with ``lr``.

    Each run gets its own copy of the callbacks: the experiment's trainer and the calls made
    are kept on the class, which copies share."""

    trainer = None
    calls: set = set()

    def __init__(self, lr, action):
        self.lr, self.action = lr, action

    def on_step_end(self, args, state, control, **kwargs):
        key = (id(_At.trainer), self.lr)
        if key not in _At.calls and args.learning_rate == self.lr:
            _At.calls.add(key)
            self.action(_At.trainer)


class _Raise(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise RuntimeError("a bug in the user's callback")


def test_the_parent_run_ends_as_the_experiment_did_and_a_rerun_reopens_it(tmp_path):
    seen = {}

    def interrupt(trainer):  # what Ctrl-C does: stop at the next chunk boundary
        run = _parent(trainer)
        seen["status"], seen["beat"] = run.info.status, run.data.tags.get(HEARTBEAT_TAG)
        trainer.engine.interrupted = True

    gate = _At(1e-3, interrupt)
    trainer = _trainer(tmp_path / "exp", callbacks=[gate])
    _At.trainer = trainer
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    # While it trained, the parent run was running with a heartbeat of about now.
    assert seen["status"] == "RUNNING" and abs(float(seen["beat"]) - time.time()) < 120
    assert _parent(trainer).info.status == "KILLED"
    assert find_experiment().state == "killed"

    def check_reopened(trainer):
        seen["again"] = _parent(trainer).info.status

    gate2 = _At(3e-3, check_reopened)
    again = _trainer(tmp_path / "exp", callbacks=[gate2])
    _At.trainer = again
    again.train()
    assert seen["again"] == "RUNNING"  # the re-run reopened it...
    parent = _parent(again)
    assert parent.info.run_id == trainer.engine.tracker.parent_run_id
    assert parent.info.status == "FINISHED"  # ...and ended it with its own outcome
    assert find_experiment().state == "finished"

    failing = _trainer(tmp_path / "bad", callbacks=[_Raise()])
    with pytest.raises(RunFailure):
        failing.train()
    assert _parent(failing).info.status == "FAILED"
    assert find_experiment(output_dir=tmp_path / "bad").state == "failed"


def test_an_op_goes_to_the_experiment_that_is_training(tmp_path, capsys):
    finished = _trainer(tmp_path / "done")
    finished.train()
    sent = {}

    def stop_from_the_cli(trainer):
        # The runs' MLflow runs are made in the background: the person sends the op once
        # run-1 shows in MLflow (before, the CLI says it has no run-1 yet).
        trainer.engine.tracker.flush()
        sent["rc"] = main(["stop", "run-1"])  # no experiment named: the training one
        sent["out"] = capsys.readouterr().out
        trainer.engine.tracker.poll_now()

    gate = _At(1e-3, stop_from_the_cli)
    live = _trainer(tmp_path / "live", callbacks=[gate])
    _At.trainer = live
    live.train()
    assert sent["rc"] == 0 and "sent to experiment 'live'" in sent["out"]
    status = {r.name: r.status for r in live.runs}
    assert status == {"run-0": "completed", "run-1": "stopped"}
    assert [(r.run, r.result) for r in live.op_log if r.source == "tag"] == [
        ("run-1", "ok: stopped at step 0")]
    # The finished experiment's run got nothing.
    tracker = finished.engine.tracker
    assert "rapidfire.op" not in tracker.client.get_run(tracker.run_id("run-1")).data.tags

    # Now none is training: refused, naming the experiments and how to choose.
    assert main(["stop", "run-0"]) == 2
    err = capsys.readouterr().err
    assert "no experiment is training" in err and "'live'" in err and "'done'" in err
    assert "--experiment" in err and "--output-dir" in err
    # `status` shows the latest.
    assert main(["status"]) == 0
    assert "experiment 'live'" in capsys.readouterr().out


def test_two_training_experiments_make_the_cli_ask_which(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    trackers = [Tracker(tmp_path / name, uri=uri) for name in ("one", "two")]
    try:
        for tracker in trackers:
            tracker.ensure_run("run-0", {}, {})
            tracker.experiment_started()
            tracker.flush()
        assert main(["stop", "run-0"]) == 2
        err = capsys.readouterr().err
        assert "2 experiments are training" in err and "'one'" in err and "'two'" in err
        assert main(["stop", "run-0", "--experiment", "two"]) == 0
        assert "sent to experiment 'two'" in capsys.readouterr().out
        tags = trackers[1].client.get_run(trackers[1].run_id("run-0")).data.tags
        assert tags["rapidfire.op"] == "stop"
        # A training process killed outright stops beating (its thread is gone, the parent
        # run stays running): once its heartbeat is old it is not training any more.
        dead = trackers.pop(0)
        dead.close(parent_status=None)
        dead.client.set_tag(dead.parent_run_id, HEARTBEAT_TAG, str(int(time.time()) - 3600))
        found = find_experiment(experiment="one")
        assert found.state == "not responding" and not found.training
        assert main(["stop", "run-0"]) == 0  # the one left training
        assert "sent to experiment 'two'" in capsys.readouterr().out
    finally:
        for tracker in trackers:
            tracker.close()


def test_an_untracked_experiment_is_controlled_through_its_folder(tmp_path, capsys):
    out = tmp_path / "quiet"
    seen = {}

    def from_the_cli(trainer):
        seen["stop"] = main(["stop", "run-1", "--dir", str(out)])
        # From outside, text is held to hyperparameters, as from a run tag.
        seen["clone"] = main(["clone", "run-0", "--set", "trust_remote_code=true",
                              "--dir", str(out)])
        seen["status"] = main(["status", "--dir", str(out)])
        seen["out"] = capsys.readouterr().out
        (out / ".rapidfire" / "inbox" / "0-bad.json").write_text("{not json")

    gate = _At(1e-3, from_the_cli)
    trainer = _trainer(out, callbacks=[gate], report_to="none")
    _At.trainer = trainer
    trainer.train()
    assert seen["stop"] == 0 and seen["clone"] == 0 and seen["status"] == 0
    assert "left in" in seen["out"] and "not tracked in MLflow, training" in seen["out"]
    assert {r.name: r.status for r in trainer.runs} == {"run-0": "completed",
                                                        "run-1": "stopped"}
    answers = [(r.source, r.run, r.result.split(":")[0]) for r in trainer.op_log]
    assert ("cli", "run-1", "ok") in answers
    assert ("cli", "run-0", "error") in answers  # the clone that would load code
    assert ("cli", "", "error") in answers  # the unreadable op file, answered, not fatal
    assert not list((out / ".rapidfire" / "inbox").glob("*.json"))
    # Not training now: refused unless left for the next train(), which applies it.
    assert main(["resume", "run-1", "--dir", str(out)]) == 2
    assert "is not training" in capsys.readouterr().err
    assert main(["stop", "run-0", "--dir", str(out), "--next-run"]) == 2  # completed
    assert "run-0 is completed" in capsys.readouterr().err
    assert main(["resume", "run-1", "--dir", str(out), "--next-run"]) == 0
    assert main(["status", "--dir", str(out)]) == 0
    assert "not training" in capsys.readouterr().out
    trainer.train()
    assert {r.name: r.status for r in trainer.runs} == {"run-0": "completed",
                                                        "run-1": "completed"}
    assert trainer.op_log[-1].source == "cli" and trainer.op_log[-1].result.startswith(
        "ok: resumed")


def test_the_cli_never_imports_the_training_stack(tmp_path):
    """--help, status, an op and an error: no torch or transformers import (seconds), and on
    a local sqlite store not MLflow either (tracked_runs.py reads its tables)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(tmp_path / "exp", uri=uri)
    try:
        tracker.ensure_run("run-0", {}, {"rapidfire.status": "running"})
        tracker.experiment_started()
        tracker.flush()
        code = (
            "import sys\n"
            "from trl_rapidfire.client.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"assert main(['status', '--uri', {uri!r}]) == 0\n"
            f"assert main(['stop', 'run-0', '--uri', {uri!r}]) == 0\n"
            f"assert main(['stop', 'run-9', '--uri', {uri!r}]) == 2\n"  # an error's path too
            "print('HEAVY', [m for m in ('torch', 'transformers', 'trl', 'peft', 'mlflow', "
            "'sqlalchemy') if m in sys.modules])\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "HEAVY []" in out.stdout, out.stdout
        assert "sent to experiment 'exp'" in out.stdout
        tags = tracker.client.get_run(tracker.run_id("run-0")).data.tags
        assert tags["rapidfire.op"] == "stop"
    finally:
        tracker.close()


def test_experiment_state_is_in_the_experiment_listing(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(tmp_path / "exp", uri=uri)
    try:
        tracker.experiment_started()
        tracker.flush()
        assert find_experiment(uri=uri).training
        tracker.experiment_ended("failed")
        tracker.flush()
        found = find_experiment(uri=uri)
        assert found.state == "failed" and not found.training
        assert json.loads((tmp_path / "exp" / ".rapidfire" / "experiment.json").read_text())[
            "id"] == found.rf_experiment
    finally:
        tracker.close(parent_status=None)
    client = MlflowClient(uri)
    assert client.get_run(tracker.parent_run_id).info.status == "FAILED"
