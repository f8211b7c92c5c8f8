"""Every error of the ``trl-rapidfire`` command is one line on stderr and exit code 2: bad
files, bad flags, unknown runs, unusable stores, and a tracking server that is down or hung
(within seconds, not MLflow's minutes of retries)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from trl_rapidfire.cli import main
from trl_rapidfire.tracking.tracker import Tracker


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"trl-rapidfire {command}: error: "), err
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def closed_port():
    # A port nothing listens on: bound once to pick it, then closed.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store(tmp_path):
    """A sqlite store holding one experiment with runs run-0 and run-1, open as a training
    process holds it (its parent run running, with a heartbeat), without training."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(tmp_path / "exp", uri=uri)
    for name in ("run-0", "run-1"):
        tracker.ensure_run(name, {}, {})
    tracker.experiment_started()
    tracker.flush()
    yield uri
    tracker.close()


@pytest.mark.parametrize("argv", [["stop", "run-0"], ["status"],
                                  ["clone", "run-0", "--set", "learning_rate=1e-4"]])
def test_a_tracking_server_nobody_listens_on_is_one_line_within_seconds(argv, closed_port,
                                                                        capsys):
    uri = f"http://127.0.0.1:{closed_port}"
    started = time.monotonic()
    assert main([*argv, "--uri", uri]) == 2
    assert time.monotonic() - started < 10
    err = _one_error_line(capsys, argv[0])
    assert f"cannot reach the MLflow tracking server at {uri}" in err and "refused" in err
    # main() leaves the caller's environment as it found it.
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_a_hung_tracking_server_from_the_environment_is_one_line_within_seconds(
    monkeypatch, capsys
):
    # Connections are accepted (by the kernel's backlog) and never answered.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        started = time.monotonic()
        assert main(["stop", "run-0"]) == 2
        assert time.monotonic() - started < 10
    assert f"cannot reach the MLflow tracking server at {uri}" in _one_error_line(capsys, "stop")


def test_the_console_command_against_a_closed_port_exits_2_with_one_line(closed_port):
    proc = subprocess.run(
        [sys.executable, "-m", "trl_rapidfire.client.cli", "stop", "run-0", "--uri",
         f"http://127.0.0.1:{closed_port}"],
        capture_output=True, text=True, timeout=120,  # MLflow's own retries take minutes
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trl-rapidfire stop: error: cannot reach")


def test_a_report_with_its_tracking_server_down_draws_from_the_files_within_seconds(
    store, tmp_path, closed_port, monkeypatch, capsys
):
    uri = f"http://127.0.0.1:{closed_port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    started = time.monotonic()
    assert main(["report", str(tmp_path / "exp"), "--out", str(tmp_path / "report")]) == 0
    assert time.monotonic() - started < 10
    assert f"MLflow at {uri} could not be read" in capsys.readouterr().out
    assert (tmp_path / "report" / "summary.md").is_file()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: [1e-3\nbf16: false\n", "invalid YAML in"),
        ("output_dir: o\nlearning_rate: !!python/object/apply:os.mkdir [MARKER]\n",
         "Python tags are never loaded"),
        ("- a\n- b\n", "must contain a YAML mapping"),
        ("output_dir: o\nuse_cpu: true\nbf16: false\nnot_a_field: 3\n", "not_a_field"),
    ],
)
def test_expand_reports_a_bad_yaml_file_in_one_line(text, message, tmp_path, capsys):
    marker = tmp_path / "made-by-yaml"
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("MARKER", str(marker)))
    assert main(["expand", str(path)]) == 2
    err = _one_error_line(capsys, "expand")
    assert message in err
    if "line" in err:
        assert str(path) in err
    assert not marker.exists()  # a YAML tag never runs code


@pytest.mark.parametrize("which", ["missing", "folder"])
def test_expand_reports_a_config_file_it_cannot_read_in_one_line(which, tmp_path, capsys):
    path = tmp_path / "missing.yaml" if which == "missing" else tmp_path
    assert main(["expand", str(path)]) == 2
    err = _one_error_line(capsys, "expand")
    assert str(path) in err and ("No such file" in err or "Is a directory" in err)


def test_report_of_a_folder_that_is_no_experiment_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["report", str(tmp_path / "afile"), "--out", str(tmp_path / "r")]) == 2
    assert "holds no trl-rapidfire experiment" in _one_error_line(capsys, "report")


def test_status_of_an_output_dir_whose_marker_is_unreadable_is_one_line(store, tmp_path,
                                                                        capsys):
    marker = tmp_path / "exp" / ".rapidfire" / "experiment.json"
    marker.write_text("{not json")
    assert main(["status", "--uri", store, "--output-dir", str(tmp_path / "exp")]) == 2
    _one_error_line(capsys, "status")


@pytest.mark.parametrize(("argv", "message"), [
    (["clone", "run-0", "--set", "learning_rate"], "--set takes KEY=VALUE"),
    (["clone", "run-0", "--set", "=1"], "--set takes KEY=VALUE"),
    (["stop", "run-7"], "no run named 'run-7'"),
    (["status", "--experiment", "nope"], "no MLflow experiment named 'nope'"),
])
def test_bad_flags_and_unknown_runs_are_one_line(argv, message, store, capsys):
    assert main([*argv, "--uri", store]) == 2
    assert message in _one_error_line(capsys, argv[0])


def test_an_unknown_run_of_a_training_experiment_may_not_be_registered_yet(store, capsys):
    # A starting experiment makes its runs' MLflow runs in the background: the error says so.
    assert main(["stop", "run-7", "--uri", store]) == 2
    err = _one_error_line(capsys, "stop")
    assert "no run named 'run-7'" in err and "try again in a moment" in err


def test_a_half_created_store_holding_runs_is_one_line_naming_the_file(tmp_path, capsys):
    import sqlite3

    from mlflow_stores import half_created

    db = tmp_path / "mlflow.db"
    half_created(db)
    with sqlite3.connect(db) as con:
        con.execute("INSERT INTO experiments (experiment_id, name, lifecycle_stage) "
                    "VALUES (1, 'mine', 'active')")
    capsys.readouterr()
    assert main(["status", "--uri", f"sqlite:///{db}"]) == 2
    err = _one_error_line(capsys, "status")
    assert f"the MLflow store {db} has a half-created schema" in err and "1 experiments" in err


def test_a_good_call_still_works_and_bugs_keep_their_traceback(store, capsys, monkeypatch):
    assert main(["stop", "run-1", "--uri", store]) == 0
    assert "run-1: stop sent" in capsys.readouterr().out
    import trl_rapidfire.client.send as control

    def broken(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(control, "deliver_op", broken)
    with pytest.raises(TypeError, match="a bug"):
        main(["stop", "run-1", "--uri", store])


def test_status_cuts_a_long_op_answer_unless_asked_for_it_whole(tmp_path, capsys):
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.cli import main as cli
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    out = tmp_path / "exp"
    rf = RFSFTTrainer(model=tiny_model_path(), train_dataset=make_sft_dataset(8, seed=1),
                      peft_config=tiny_lora_config(r=4),
                      args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]),
                                       num_chunks=2, per_device_train_batch_size=4,
                                       **cpu_training_kwargs()))
    rf.engine.queue_op("run-0", 'clone {"' + "x" * 300 + '": 1}')  # answered with a long error
    rf.train()
    answer = rf.op_log[0].result
    assert answer.startswith("error:") and len(answer) > 300
    capsys.readouterr()
    assert cli(["status", "--output-dir", str(out)]) == 0
    shown = capsys.readouterr().out
    assert answer not in shown and answer[:59] + "…" in shown
    assert max(len(line) for line in shown.splitlines() if line.startswith("run-")) < 120
    # The knob that differs between the runs is a column (from the folder's shared state).
    header = next(line for line in shown.splitlines() if line.startswith("run "))
    # The ranking metric (the loss: nothing evaluated) is a column too, the rows best first.
    assert header.split() == ["run", "status", "steps", "chunks", "loss", "learning_rate",
                              "last", "op"]
    column = header.index("learning_rate")
    rates = {line.split()[0]: line[column:].split()[0] for line in shown.splitlines()
             if line.startswith("run-")}
    assert rates == {"run-0": "0.001", "run-1": "0.003"}
    assert cli(["status", "--output-dir", str(out), "--full"]) == 0
    assert answer in capsys.readouterr().out
