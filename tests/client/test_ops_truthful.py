"""Every op is applied or refused, and says which (issue 54, item 3): an op sent to a finished
experiment for its script's next run is applied by that run's ``train()``, even when nothing
else is left to train, and one that the next run could not apply is refused at once, with
the reason. Real processes where the issue is about them (a re-run of the script, the CLI),
a real sqlite store in a temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.client.cli import main
from trl_rapidfire.client.experiments import experiment_runs, find_experiment
from trl_rapidfire.control.folder_control import folder_runs
from trl_rapidfire.control.ops import read_op_rows
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

SCRIPT = Path(__file__).resolve().parents[1] / "experiment_script.py"


def _script_env(**more: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", RF_TEST_REPORT_TO="mlflow", RF_TEST_ROWS="48",
               **more)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "RF_TEST_STOP"):
        if key not in more:
            env.pop(key, None)  # the store is ./mlflow.db of the folder it runs in
    return env


def _run_script(cwd: Path, out: Path, **env: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), str(out)], cwd=cwd, env=_script_env(**env),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = _script_env()
    return subprocess.run(["trl-rapidfire", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _tags(uri: str, run: str) -> dict[str, str]:
    exp = find_experiment(uri=uri)
    tracked = {r.tags.get("rapidfire.run"): r for r in experiment_runs(exp)}
    return MlflowClient(uri).get_run(tracked[run].run_id).data.tags


@pytest.mark.slow
def test_a_resume_left_for_the_next_run_trains_the_run_when_nothing_else_is_left(tmp_path):
    """The issue's case: the experiment finished with a stopped run (its chunks out of the
    count: "N of N chunks done"); `resume --next-run` said the next train() applies it; the
    re-run found nothing left to train and ended, the tag still pending."""
    out, uri = tmp_path / "exp", f"sqlite:///{tmp_path / 'mlflow.db'}"
    _run_script(tmp_path, out, RF_TEST_STOP="run-1")
    assert {r.name: r.status.value for r in folder_runs(out)}["run-1"] == "stopped"

    # A completed run keeps only its final weights: the re-run, a new process, would have
    # nothing to warm-start a clone from. Refused now, saying why, and nothing is left.
    warm = _cli(tmp_path, "clone", "run-0", "--warm", "--next-run")
    assert warm.returncode == 2 and "no checkpoint" in warm.stderr, warm.stderr
    assert "use clone" in warm.stderr and "rapidfire.op" not in _tags(uri, "run-0")

    sent = _cli(tmp_path, "resume", "run-1", "--next-run")
    assert sent.returncode == 0, sent.stderr
    # It says when it applies, and that is true (below): at the script's next train().
    assert "next train()" in sent.stdout and "next chunk boundary" not in sent.stdout, sent.stdout
    assert _tags(uri, "run-1")["rapidfire.op"] == "resume"

    _run_script(tmp_path, out)
    statuses = {r.name: r.status.value for r in folder_runs(out)}
    assert statuses == dict.fromkeys(("run-0", "run-1", "run-2", "run-3"), "completed")
    rows = [(r.source, r.run, r.op, r.result) for r in read_op_rows(Layout(out).ops_log)]
    assert ("tag", "run-1", "resume", "ok: resumed at step 0") in rows, rows
    tags = _tags(uri, "run-1")
    assert "rapidfire.op" not in tags, tags  # answered: the tag is gone, its answer there
    assert tags["rapidfire.op.result"] == "ok: resumed at step 0"
    assert tags["rapidfire.op.seq"] == "1"
    assert tags["rapidfire.status"] == "completed"


def _trainer(out: Path) -> RFSFTTrainer:
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), num_chunks=2, max_steps=2,
                         learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                         **{**cpu_training_kwargs(), "report_to": "mlflow"}),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
    )


def test_a_delete_left_for_the_next_run_is_applied_by_a_rerun_with_nothing_to_train(
        tmp_path, monkeypatch, capsys):
    """The panel's Delete of the issue, sent through the CLI: a re-run (a new trainer on the
    same folder, as the script run again builds it) with every run completed applies it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # where the CLI looks for a folder that is training
    out = tmp_path / "exp"
    _trainer(out).train()
    assert main(["delete", "run-0", "--next-run"]) == 0
    said = capsys.readouterr().out
    assert "next train()" in said and "next chunk boundary" not in said, said

    again = _trainer(out)
    again.train()
    assert {r.name: r.status for r in again.runs} == {"run-0": "deleted", "run-1": "completed"}
    assert [(r.source, r.run, r.result) for r in again.op_log] == [
        ("tag", "run-0", "ok: deleted")]
    again.engine.tracker.flush()
    tags = _tags(uri, "run-0")
    assert "rapidfire.op" not in tags and tags["rapidfire.op.result"] == "ok: deleted", tags


def test_an_op_the_next_run_cannot_apply_is_refused_at_once_with_why(tmp_path, monkeypatch,
                                                                    capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # where the CLI looks for a folder that is training
    out = tmp_path / "exp"
    trainer = _trainer(out)
    trainer.train()
    refused = {
        ("stop", "run-0"): "run-0 is completed; only pending or running runs stop",
        ("resume", "run-1"): "run-1 is completed; only a stopped run can be resumed",
    }
    for (verb, run), why in refused.items():
        assert main([verb, run, "--next-run"]) == 2
        err = capsys.readouterr().err
        assert why in err, err
    assert all("rapidfire.op" not in _tags(uri, run) for run in ("run-0", "run-1"))
    # Without --next-run nothing is left anywhere: the experiment is not training.
    assert main(["delete", "run-0"]) == 2
    assert "no experiment is training" in capsys.readouterr().err
    # The process that trained it is alive (this one, as a notebook's kernel): its next
    # train() has run-0's last weights in memory, so a warm clone of the completed run is
    # sent, and that train() applies it, as it said.
    assert main(["clone", "run-0", "--warm", "--next-run"]) == 0
    assert "next train()" in capsys.readouterr().out
    trainer.train()
    assert trainer.op_log[-1].result == "ok: created run-2 warm-started from run-0"
