"""Ops in the first seconds of ``train()`` (issue 54, the start-up window): the tracking store
is made, and the experiment listed in it, by the tracking thread, seconds after ``train()``
starts (MLflow's import, the schema, the experiment's parent run); an op sent meanwhile
reaches the experiment through its folder, which says it trains from the first moment, and
an error names what is missing and where it looked. The training script and the CLI run as
a person runs them: separate processes, the CLI from the folder that will hold mlflow.db."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from trl_rapidfire.client.cli import main
from trl_rapidfire.client.experiments import experiment_runs, find_experiment
from trl_rapidfire.control.folder_control import alive, folder_runs, live_folders
from trl_rapidfire.control.ops import read_op_rows
from trl_rapidfire.storage.layout import Layout

SCRIPT = Path(__file__).resolve().parents[1] / "experiment_script.py"


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", RF_TEST_REPORT_TO="mlflow", RF_TEST_ROWS="96")
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "RF_TEST_STOP"):
        env.pop(key, None)  # the store is ./mlflow.db of the folder the script runs in
    return env


def _start(cwd: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), str(out)], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the script ended before {what}: {proc.stdout.read()}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.02)


def _cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["trl-rapidfire", *argv], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=120)


def _finish(proc: subprocess.Popen) -> str:
    printed, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, printed[-3000:]
    return printed


def _stopped_by_the_cli(out: Path, run: str) -> None:
    rows = [(r.source, r.run, r.op, r.result.split(" at ")[0])
            for r in read_op_rows(Layout(out).ops_log)]
    assert rows == [("cli", run, "stop", "ok: stopped")], rows
    assert {r.name: r.status.value for r in folder_runs(out)}[run] == "stopped"
    # The answer reached the run's MLflow run too, once it was made.
    tags = {r.tags.get("rapidfire.run"): r.tags for r in experiment_runs(
        find_experiment(uri=f"sqlite:///{out.parent / 'mlflow.db'}"))}
    assert tags[run].get("rapidfire.op.result", "").startswith("ok: stopped"), tags[run]


def test_an_op_as_train_starts_reaches_it_from_the_folder_that_holds_the_store(tmp_path):
    """No --dir, from the script's folder, the moment train() began: the store is not there
    yet (or does not list the experiment as training), and the op still reaches it."""
    out = tmp_path / "exp"
    proc = _start(tmp_path, out)
    try:
        _wait_for(lambda: alive(Layout(out)) is not None, proc, "train()")
        sent = _cli(tmp_path, "stop", "run-3")
    finally:
        printed = _finish(proc)
    assert sent.returncode == 0, sent.stderr
    assert "inbox" in sent.stdout and "next chunk boundary" in sent.stdout, sent.stdout
    _stopped_by_the_cli(out, "run-3")
    assert "Traceback" not in printed


def test_an_op_naming_the_folder_reaches_it_before_the_store_lists_it(tmp_path):
    """--dir, while the tracking thread cannot list the experiment yet: it is held at the
    lock under which it creates the experiment in the store (as a slow store would hold
    it), so the window is open for sure when the CLI runs."""
    out = tmp_path / "exp"
    proc = _start(tmp_path, out)
    held = FileLock(str(Layout(out).state_dir / "tracking.lock"))
    try:
        _wait_for(Layout(out).experiment_marker.is_file, proc, "the experiment's marker")
        with held:
            _wait_for(lambda: alive(Layout(out)) is not None, proc, "train()")
            assert main(["status", "--dir", str(out)]) == 2  # the store does not list it
            sent = _cli(tmp_path, "stop", "run-3", "--dir", str(out))
    finally:
        printed = _finish(proc)
    assert sent.returncode == 0, sent.stderr
    assert f"{out}'s inbox" in sent.stdout, sent.stdout
    assert str(out / "ops.csv") in sent.stdout
    _stopped_by_the_cli(out, "run-3")
    assert "Traceback" not in printed


@pytest.mark.slow
def test_an_op_as_a_rerun_starts_reaches_it_while_the_store_still_reads_finished(tmp_path):
    """A re-run: the store lists the experiment, as its last train() ended ("finished"),
    until the new train()'s tracking thread reopens it; the CLI said "no experiment is
    training". The resume reaches the re-run, which trains the stopped run."""
    out = tmp_path / "exp"
    first = subprocess.run([sys.executable, str(SCRIPT), str(out)], cwd=tmp_path,
                           env=dict(_env(), RF_TEST_STOP="run-1"), capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    proc = _start(tmp_path, out)
    try:
        _wait_for(lambda: alive(Layout(out)) is not None, proc, "train()")
        sent = _cli(tmp_path, "resume", "run-1")
    finally:
        _finish(proc)
    assert sent.returncode == 0, sent.stderr
    assert f"{out}'s inbox" in sent.stdout, sent.stdout
    rows = [(r.source, r.run, r.op, r.result) for r in read_op_rows(Layout(out).ops_log)]
    assert ("cli", "run-1", "resume", "ok: resumed at step 0") in rows, rows
    assert {r.name: r.status.value for r in folder_runs(out)}["run-1"] == "completed"


def test_with_no_experiment_anywhere_the_error_says_what_is_missing_and_where_it_looked(
        tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["stop", "run-0"]) == 2
    err = capsys.readouterr().err
    assert f"no MLflow store at sqlite:///{tmp_path / 'mlflow.db'}" in err, err
    assert f"{tmp_path / 'mlflow.db'} does not exist" in err, err
    assert f"looked for .rapidfire/alive.json of a live process in {tmp_path}" in err, err
    assert err.count("\n") == 1
    # A folder named: the store has no such experiment, and the folder says no process
    # trains it (an experiment built, never trained: its marker, no alive.json).
    folder = tmp_path / "built"
    (folder / ".rapidfire").mkdir(parents=True)
    (folder / ".rapidfire" / "experiment.json").write_text(json.dumps({"id": "ab" * 16}))
    assert main(["stop", "run-0", "--dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "no MLflow store" in err and f"{Layout(folder).alive_file} names no live" in err


def _mark_alive(folder: Path, pid: int) -> None:
    (folder / ".rapidfire").mkdir(parents=True)
    (folder / ".rapidfire" / "alive.json").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": pid, "since": time.time()}))


def test_the_folders_a_look_finds_are_live_ones_within_its_depth(tmp_path):
    _mark_alive(tmp_path / "outputs" / "demo", os.getpid())  # two levels down: found
    _mark_alive(tmp_path / "a" / "b" / "deep", os.getpid())  # three: not looked at
    _mark_alive(tmp_path / ".hidden", os.getpid())
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    _mark_alive(tmp_path / "gone", int(ended.stdout))  # its process has ended
    (tmp_path / "link").symlink_to(tmp_path / "outputs")  # links are not followed
    assert live_folders(tmp_path) == [tmp_path / "outputs" / "demo"]
    assert live_folders(tmp_path, depth=3) == [tmp_path / "a" / "b" / "deep",
                                               tmp_path / "outputs" / "demo"]
