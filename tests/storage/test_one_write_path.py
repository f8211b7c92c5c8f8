"""One write path for every file under ``output_dir`` (storage/write_path.py): a symbolic link,
a hard link or a folder swapped for a link, at any file or folder the experiment writes, is
refused naming the path; before training that is one clear error before anything trains,
during training the run that meets it fails alone; nothing is ever written outside (the
outside file's bytes and time stay as they were)."""

from __future__ import annotations

import os
import shutil
import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.checkpoints import write_atomically
from trl_rapidfire.storage.csv_logs import append_row
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.storage.own_files import LinkRefused, append_text, open_nofollow, write_atomic
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

KINDS = ["symlink", "hardlink"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


class Outside:
    """A folder outside the experiment with one file in it, whose bytes and time must stay."""

    def __init__(self, tmp_path: Path) -> None:
        self.folder = tmp_path / "elsewhere"
        self.folder.mkdir()
        self.file = self.folder / "bashrc"
        self.file.write_text("export KEEP=1\n")
        os.utime(self.file, (1_000_000_000, 1_000_000_000))
        self.before = self._look()

    def _look(self) -> tuple[list[str], bytes, int]:
        return (sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*")),
                self.file.read_bytes(), self.file.stat().st_mtime_ns)

    def unchanged(self) -> bool:
        return self._look() == self.before


def _plant(path: Path, kind: str, outside: Outside) -> None:
    """Put a link of ``kind`` at ``path``: to the outside file, or (a folder) to the outside
    folder; a real folder there is removed first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "hardlink":
        os.link(outside.file, path)
    elif kind == "symlink":
        path.symlink_to(outside.file)
    else:  # a folder swapped for a link
        path.symlink_to(outside.folder, target_is_directory=True)


# ------------------------------------------------------------------ the write path itself


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("write", ["append_text", "append_row", "open_for_append",
                                   "write_atomic"])
def test_no_write_goes_through_a_link_at_the_file(tmp_path, kind, write):
    out = tmp_path / "out"
    Layout(out)  # an experiment's root
    outside = Outside(tmp_path)
    path = out / "ops.csv"
    _plant(path, kind, outside)
    if write == "write_atomic":  # replaces the name: the link goes, its target stays
        write_atomic(path, "fresh\n")
        assert path.read_text() == "fresh\n" and not path.is_symlink()
        assert path.stat().st_nlink == 1
    else:
        with pytest.raises(LinkRefused, match="ops.csv (is a symbolic link|has 2 names)"):
            if write == "append_text":
                append_text(path, "stop $(touch X)\n")
            elif write == "append_row":
                append_row(path, ["op"], {"op": "stop $(touch X)"})
            else:
                os.close(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
    assert outside.unchanged()


@pytest.mark.parametrize("folder", [".rapidfire", "runs", "runs/run-0"])
@pytest.mark.parametrize("write", ["append_text", "write_atomic", "folder"])
def test_no_write_goes_through_a_folder_link_below_the_root(tmp_path, folder, write):
    out = tmp_path / "out"
    Layout(out)
    outside = Outside(tmp_path)
    _plant(out / folder, "folder", outside)
    path = out / folder / "x" / "file"
    with pytest.raises(LinkRefused, match=f"{out / folder} is a symbolic link"):
        if write == "append_text":
            append_text(path, "text")
        elif write == "write_atomic":
            write_atomic(path, "text")
        else:
            write_atomically(path, lambda tmp: (tmp / "weights").write_text("w"))
    assert outside.unchanged()


def test_a_folder_swapped_while_a_writer_fills_it_is_not_written_through(tmp_path):
    out = tmp_path / "out"
    Layout(out)
    outside = Outside(tmp_path)
    parent = out / ".rapidfire" / "checkpoints" / "run-0"

    def write(tmp: Path) -> None:
        (tmp / "optimizer.pt").write_text("first half")
        os.rename(parent, parent.with_name("run-0.moved"))  # swapped mid-write
        parent.symlink_to(outside.folder, target_is_directory=True)
        (tmp / "scheduler.pt").write_text("second half")

    with pytest.raises(LinkRefused, match=f"{parent} was moved or replaced"):
        write_atomically(parent / "checkpoint-6", write)
    assert outside.unchanged()


# ------------------------------------------------------------------ a whole experiment


def _experiment(out: Path, callbacks=None, **args) -> RFSFTTrainer:
    """Two runs of 4 steps in 4 chunks, each boundary checkpointed."""
    options = dict(output_dir=str(out), num_chunks=4, max_steps=4, checkpoint_every="chunk",
                   learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                   **cpu_training_kwargs())
    options.update(args)
    return RFSFTTrainer(model=tiny_model_path(), args=RFSFTConfig(**options),
                        train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4),
                        callbacks=callbacks)


FILES = ["ops.csv", "schedule.csv", "search.csv", ".rapidfire/scheduler.journal",
         ".rapidfire/optuna.journal"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", FILES)
def test_a_link_at_a_file_is_one_error_before_anything_trains(tmp_path, name, kind):
    out, outside = tmp_path / "out", Outside(tmp_path)
    _plant(out / name, kind, outside)
    with pytest.raises(RFConfigError) as raised:
        _experiment(out).train()
    assert str(out / name) in str(raised.value)
    assert "symbolic link" in str(raised.value) or "2 names" in str(raised.value)
    assert not (out / "runs" / "run-0" / "final").exists()
    assert outside.unchanged()


FOLDERS = [".rapidfire/checkpoints/run-0", "runs/run-0/final", "runs/run-0/runs"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_folder_link_even_inside_is_one_error_before_anything_trains(tmp_path, folder):
    out = tmp_path / "out"
    trainer = _experiment(out)
    (out / "inside").mkdir(parents=True)
    path = out / folder
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    path.symlink_to(out / "inside", target_is_directory=True)
    with pytest.raises(RFConfigError, match=f"{path} is a symbolic link"):
        trainer.train()
    assert not trainer.schedule
    assert list((out / "inside").iterdir()) == []


class SwapDuringTraining(TrainerCallback):
    """Once run-0 has trained ``after`` steps, ``path`` becomes a link out (from the training
    thread, or from another thread racing the writers)."""

    def __init__(self, path: Path, kind: str, outside: Outside, after: int = 2) -> None:
        self.path, self.kind, self.outside, self.after = path, kind, outside, after
        self.done = False

    def on_step_end(self, args, state, control, **kwargs):
        if (not self.done and Path(args.output_dir).name == "run-0"
                and state.global_step >= self.after):
            self.done = True
            thread = threading.Thread(target=_plant, args=(self.path, self.kind, self.outside))
            thread.start()
            thread.join()


@pytest.mark.parametrize("where", [".rapidfire/checkpoints/run-0", "runs/run-0/final",
                                   "runs/run-0"])
def test_a_folder_swapped_for_a_link_while_training_fails_that_run_alone(tmp_path, where):
    out, outside = tmp_path / "out", Outside(tmp_path)
    path = out / where
    trainer = _experiment(out, callbacks=[SwapDuringTraining(path, "folder", outside)])
    with pytest.warns(RuntimeWarning, match="run-0"):
        trainer.train()
    runs = {r.name: r for r in trainer.runs}
    assert runs["run-0"].status == RunStatus.FAILED
    assert str(path) in runs["run-0"].error
    assert runs["run-1"].status == RunStatus.COMPLETED
    assert (out / "runs" / "run-1" / "final" / "adapter_model.safetensors").is_file()
    assert outside.unchanged()


def test_tensorboard_logs_never_go_through_a_link_at_their_guessable_name(tmp_path):
    """transformers names a run's logs ``runs/<Mon DD_HH-MM-SS_host>``: links planted at the
    names of the coming minutes are never written through."""
    from transformers.integrations.integration_utils import default_logdir

    out, outside = tmp_path / "out", Outside(tmp_path)
    trainer = _experiment(out, report_to="tensorboard")
    now = datetime.now()
    for run in ("run-0", "run-1"):
        (out / "runs" / run / "runs").mkdir(parents=True, exist_ok=True)
        for second in range(120):
            when = (now + timedelta(seconds=second)).strftime("%b%d_%H-%M-%S")
            name = f"{when}_{Path(default_logdir()).name.split('_', 2)[-1]}"
            (out / "runs" / run / "runs" / name).symlink_to(outside.folder)
    trainer.train()
    assert {r.status for r in trainer.runs} == {RunStatus.COMPLETED}
    for run in ("run-0", "run-1"):
        events = list((out / "runs" / run / "runs").glob("*/events.out.tfevents.*"))
        assert len(events) == 1 and not events[0].parent.is_symlink()
    assert outside.unchanged()


def test_a_tensorboard_folder_made_a_link_before_its_run_begins_fails_that_run(tmp_path):
    out, outside = tmp_path / "out", Outside(tmp_path)
    # run-0's first step ends before run-1's train() begins (one chunk each in turn).
    trainer = _experiment(out, report_to="tensorboard", callbacks=[
        SwapDuringTraining(out / "runs/run-1/runs", "folder", outside, after=1)])
    with pytest.warns(RuntimeWarning, match="run-1"):
        trainer.train()
    runs = {r.name: r for r in trainer.runs}
    assert runs["run-1"].status == RunStatus.FAILED
    assert f"{out / 'runs/run-1/runs'} is a symbolic link" in runs["run-1"].error
    assert runs["run-0"].status == RunStatus.COMPLETED
    assert outside.unchanged()


def test_schedule_csv_made_a_hard_link_while_training_is_refused_naming_it(tmp_path):
    out, outside = tmp_path / "out", Outside(tmp_path)
    trainer = _experiment(out, callbacks=[
        SwapDuringTraining(out / "schedule.csv", "hardlink", outside)])
    with pytest.raises(LinkRefused, match=f"{out / 'schedule.csv'} has 2 names"):
        trainer.train()
    assert outside.unchanged()
