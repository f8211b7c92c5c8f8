"""The CLI's view of a tracked experiment and its op commands, against a real sqlite store."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.client.cli import main
from trl_rapidfire.client.send import find_experiment
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp / "exp"), num_chunks=2, max_steps=2,
                         learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                         **{**cpu_training_kwargs(), "report_to": "mlflow"}),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
    )
    rf.train()
    yield rf, tmp, uri
    mp.undo()


def _tags(uri, rf, run):
    tracker = rf.engine.tracker
    return MlflowClient(uri).get_run(tracker.run_id(run)).data.tags


def test_status_prints_every_run(experiment, capsys):
    rf, tmp, uri = experiment
    assert main(["status", "--uri", uri]) == 0
    out = capsys.readouterr().out
    assert "experiment 'exp'" in out
    assert "run-0" in out and "run-1" in out and "completed" in out and "step 2/2" in out
    # The knob that differs is a column, each run's value in it (from its MLflow params; the
    # per-run output_dir differs too, and is no knob); the progress counts the run's chunks.
    header = next(line for line in out.splitlines() if line.startswith("run "))
    assert header.split() == ["run", "status", "progress", "loss", "eval_loss",
                              "learning_rate", "pending", "op", "last", "op"]
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("run-")}
    column = header.index("learning_rate")
    assert [rows[r][column:].split()[0] for r in ("run-0", "run-1")] == ["0.001", "0.003"]
    assert "done 2/2 (step 2/2)" in rows["run-0"]
    assert main(["status", "--uri", uri, "--output-dir", str(tmp / "exp")]) == 0
    found = find_experiment(uri=uri, experiment="exp")
    assert found.rf_experiment == rf.engine.tracker.rf_experiment


def test_op_commands_set_the_tag_the_experiment_reads(experiment, capsys):
    rf, tmp, uri = experiment
    # The experiment has finished: an op would wait for its next train(), so it is refused
    # unless asked for; stopping its completed run-1 is refused by the run's status anyway.
    assert main(["clone", "run-0", "--set", "learning_rate=1e-4", "--uri", uri]) == 2
    err = capsys.readouterr().err
    assert "no experiment is training" in err and "'exp'" in err and "finished" in err
    assert main(["clone", "run-0", "--uri", uri, "--output-dir", str(tmp / "exp")]) == 2
    assert "is not training" in capsys.readouterr().err
    assert main(["stop", "run-1", "--uri", uri, "--next-run"]) == 2
    assert "run-1 is completed; only pending or running runs stop" in capsys.readouterr().err
    assert "rapidfire.op" not in _tags(uri, rf, "run-1")
    # A tag set as the UI would (no checks) is answered by the engine with the same reason.
    MlflowClient(uri).set_tag(rf.engine.tracker.run_id("run-1"), "rapidfire.op", "stop")
    assert main(["clone", "run-0", "--set", "learning_rate=1e-4", "--set",
                 "peft_config.r=8", "--set", "lr_scheduler_type=cosine", "--uri", uri,
                 "--next-run"]) == 0
    assert _tags(uri, rf, "run-0")["rapidfire.op"] == (
        'clone {"learning_rate": 0.0001, "peft_config.r": 8, "lr_scheduler_type": "cosine"}'
    )
    # The experiment picks them up at its next boundary (here: the next train()).
    rf.engine.tracker.poll_now()
    rf.train()
    results = {r.run: r.result for r in rf.op_log}
    assert results["run-1"].startswith("error: run-1 is completed")
    assert results["run-0"] == "ok: created run-2"
    clone = {r.name: r for r in rf.runs}["run-2"]
    assert clone.status == "completed" and clone.knobs["peft_config"].r == 8
    assert "rapidfire.op" not in _tags(uri, rf, "run-0")
    assert _tags(uri, rf, "run-0")["rapidfire.op.result"] == results["run-0"]
    assert _tags(uri, rf, "run-0")["rapidfire.op.seq"] == "1"
    assert _tags(uri, rf, "run-1")["rapidfire.op.seq"] == "1"  # rejected ops are answered too
    assert "sent to experiment 'exp'" in capsys.readouterr().out
    # The other op commands write their tags the same way (the docs show each of them).
    assert main(["resume", "run-1", "--uri", uri, "--next-run"]) == 2  # completed
    assert "only a stopped run can be resumed" in capsys.readouterr().err
    assert main(["delete", "run-2", "--uri", uri, "--next-run"]) == 0
    assert _tags(uri, rf, "run-2")["rapidfire.op"] == "delete"
    assert main(["clone", "run-0", "--set", "learning_rate=1e-4", "--warm", "--uri", uri,
                 "--next-run"]) == 0
    assert _tags(uri, rf, "run-0")["rapidfire.op"] == 'clone-warm {"learning_rate": 0.0001}'


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["stop", "run-9", "--next-run"], "no run named 'run-9'"),
        (["resume"], None),  # argparse: RUN missing (exit 2 via SystemExit)
        (["clone", "run-0", "--set", "learning_rate"], "--set takes KEY=VALUE"),
        (["clone", "run-0", "--set", "=3"], "--set takes KEY=VALUE"),
        (["status", "--experiment", "nope"], "no MLflow experiment named 'nope'"),
        (["status", "--output-dir", "/nonexistent"], "holds no trl-rapidfire experiment"),
        (["stop", "run-0", "--uri", "sqlite:////nonexistent/dir/mlflow.db"], "no MLflow store"),
    ],
)
def test_bad_cli_calls_are_one_clear_line_and_a_nonzero_exit(experiment, capsys, argv,
                                                              message):
    _, _, uri = experiment
    if "--uri" not in argv:
        argv = [*argv, "--uri", uri] if argv[0] != "resume" else argv
    if message is None:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        return
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"trl-rapidfire {argv[0]}: error: ") and message in err
    assert "\n" not in err
