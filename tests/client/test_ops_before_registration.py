"""An op for a run whose MLflow run is not made yet: a starting experiment registers its runs
in the background, so a person who names the experiment's folder reaches the run through the
folder's inbox, which the experiment reads at every chunk boundary (real sqlite store, real
shared state, the CLI called as a user would)."""

from __future__ import annotations

import pytest
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.client.cli import main
from trl_rapidfire.control.folder_control import Inbox
from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)
from trl_rapidfire.tracking.tracker import Tracker


@pytest.fixture
def starting(tmp_path):
    """A training experiment in ``tmp_path/exp`` whose shared state has run-0..run-2 while
    MLflow has run-0 and run-1 only (run-2 not registered yet)."""
    out = tmp_path / "exp"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(out, uri=uri)
    for name in ("run-0", "run-1"):
        tracker.ensure_run(name, {}, {})
    tracker.experiment_started()
    tracker.flush()
    with FileStore(Layout(out).state_dir, "fp").transaction() as state:
        for name in ("run-0", "run-1", "run-2"):
            state.add_run(name, 3)
    yield out, uri
    tracker.close()


def test_an_op_for_a_run_not_registered_yet_goes_through_the_named_folder(starting, capsys):
    out, uri = starting
    assert main(["stop", "run-2", "--uri", uri, "--dir", str(out)]) == 0
    said = capsys.readouterr().out
    assert "run-2: stop left in experiment" in said, said
    assert "its MLflow run is not made yet" in said, said
    mail = Inbox(Layout(out)).take()
    assert [(m.run, m.op) for m in mail] == [("run-2", "stop")]

    # A run the folder does not have either is still unknown, and says so.
    assert main(["stop", "run-9", "--uri", uri, "--dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no run named 'run-9'" in err and "try again" not in err, err
    # Without the folder the CLI cannot know the run yet: it says how to reach it now.
    assert main(["stop", "run-2", "--uri", uri]) == 2
    err = capsys.readouterr().err
    assert "try again in a moment" in err and "--dir" in err, err
    assert len(Inbox(Layout(out)).take()) == 1  # nothing more was posted


def test_a_run_whose_status_rules_the_op_out_is_refused_through_the_folder_too(starting,
                                                                            capsys):
    out, uri = starting
    assert main(["resume", "run-2", "--uri", uri, "--dir", str(out)]) == 2
    assert "run-2" in capsys.readouterr().err
    assert Inbox(Layout(out)).take() == []


class _PostAtFirstStep(TrainerCallback):
    """Leaves a stop for run-1 in the folder's inbox at run-0's first step, as the CLI does
    before run-1's MLflow run exists."""

    def __init__(self, out):
        self.out, self.posted = out, False

    def on_step_end(self, args, state, control, **kwargs):
        if not self.posted and args.output_dir.endswith("run-0"):
            self.posted = True
            Inbox(Layout(self.out)).post("run-1", "stop")


def test_a_tracked_experiment_applies_an_op_left_in_its_inbox_and_answers_it(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    out = tmp_path / "exp"
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         max_steps=4, per_device_train_batch_size=4,
                         **dict(cpu_training_kwargs(), report_to="mlflow")),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
        callbacks=[_PostAtFirstStep(out)],
    )
    trainer.train()
    assert {r.name: r.status for r in trainer.runs} == {"run-0": "completed",
                                                        "run-1": "stopped"}
    assert [(r.source, r.run, r.result) for r in trainer.op_log] == [
        ("cli", "run-1", "ok: stopped at step 0")]
    assert Inbox(Layout(out)).waiting() == 0  # answered, so taken out
    tracker = trainer.engine.tracker
    tracker.flush()
    tags = tracker.client.get_run(tracker.run_id("run-1")).data.tags
    assert tags.get("rapidfire.op.result", "").startswith("ok: stopped"), tags
