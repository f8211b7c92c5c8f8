"""Two plain processes (``python script.py``, no launcher) on one ``output_dir`` with the same
runs: the second is refused at once, naming the first's host and pid, and MLflow gets every
(run, metric, step) point exactly once (docs/security.md, "One experiment in a folder at a
time")."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _start(out: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TESTS / "experiment_script.py"), str(out)],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"))


def _points(uri: str) -> collections.Counter:
    """How many times each (run, key, step) point is in the store."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text(
            "SELECT t.value, m.key, m.step FROM metrics m JOIN tags t "
            "ON t.run_uuid = m.run_uuid AND t.key = 'rapidfire.run'")).fetchall()
    engine.dispose()
    return collections.Counter((run, key, step) for run, key, step in rows)


def _wait_alive(out: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    state = out / ".rapidfire" / "scheduler.json"
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / ".rapidfire" / "alive.json").is_file() and state.is_file():
            return
        time.sleep(0.2)
    raise AssertionError("the first process never started training")


@pytest.mark.slow
def test_a_second_plain_process_is_refused_at_once_and_no_point_is_logged_twice(tmp_path):
    out, uri = tmp_path / "exp", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, RF_TEST_ROWS="400", RF_TEST_REPORT_TO="mlflow",
               MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME="exp", HF_HUB_OFFLINE="1")
    first = _start(out, env, tmp_path / "first.log")
    try:
        _wait_alive(out, first)
        second = _start(out, env, tmp_path / "second.log")
        assert second.wait(timeout=300) != 0, "the second process trained beside the first"
        said = (tmp_path / "second.log").read_text()
        assert f"process {first.pid} on {socket.gethostname()}" in said, said[-3000:]
        assert first.poll() is None, "refused after the first had ended: not at once"
        assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        for proc in (first,):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    points = _points(uri)
    assert points, "nothing was logged"
    assert {p: n for p, n in points.items() if n > 1} == {}
    assert {run for run, _, _ in points} == {f"run-{i}" for i in range(4)}


@pytest.mark.slow
def test_two_plain_processes_started_together_log_every_point_once(tmp_path):
    out, uri = tmp_path / "exp", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, RF_TEST_ROWS="200", RF_TEST_REPORT_TO="mlflow",
               MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME="exp", HF_HUB_OFFLINE="1")
    procs = [_start(out, env, tmp_path / f"p{i}.log") for i in range(2)]
    try:
        codes = sorted(p.wait(timeout=600) for p in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    logs = [(tmp_path / f"p{i}.log").read_text() for i in range(2)]
    assert codes[0] == 0, logs
    assert codes == [0, 1], logs  # one trains, the other is refused
    assert any("One experiment trains in a folder at a time" in log for log in logs), logs
    points = _points(uri)
    assert {p: n for p, n in points.items() if n > 1} == {}
    assert {run for run, _, _ in points} == {f"run-{i}" for i in range(4)}
