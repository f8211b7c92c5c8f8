"""Trust and faults, second pass: no tag or file can stop an experiment, no link in its folder
reaches outside it, a diverged run is not "best", and one experiment trains in a folder at a
time. Each case failed on the code before this pass (a raw ``RecursionError`` out of
``train()``, files outside the folder read, written, moved or deleted, a ``nan`` run picked as
the best)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file
from state_files import add_run, read_state
from transformers import TrainerCallback

from trl_rapidfire import List, RFConfigError, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.control.folder_control import Inbox
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BASE = {k: v for k, v in cpu_training_kwargs().items() if k != "report_to"}
BASE.update(per_device_train_batch_size=4, logging_steps=1)
DEEP = "[" * 1500 + "]" * 1500


def _trainer(out, *, report_to="none", lrs=(1e-3, 3e-3), callbacks=None, **kw):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(list(lrs)), num_chunks=2,
                         max_steps=2, report_to=report_to, **BASE, **kw),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
        callbacks=callbacks,
    )


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.json").write_text('{"run": "run-0", "op": "delete"}')
    (victim / "keep.txt").write_text("precious")
    return victim


def _unchanged(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["keep.json", "keep.txt"]
    assert (victim / "keep.txt").read_text() == "precious"
    assert (victim / "keep.json").read_text() == '{"run": "run-0", "op": "delete"}'


def _ops(out: Path) -> list[dict[str, str]]:
    import csv

    with open(out / "ops.csv", newline="") as fh:
        return list(csv.DictReader(fh))


# ----------------------------------------------------------------------- bounded text


def test_a_1500_deep_tag_op_is_answered_and_the_experiment_trains_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    rf = _trainer(tmp_path / "exp", report_to="mlflow")
    tracker = rf.engine.tracker
    run_id = tracker.run_id("run-0")
    tracker.client.set_tag(run_id, "rapidfire.op", 'clone {"learning_rate": ' + DEEP + "}")
    tracker.poll_now()
    (bad,) = rf.engine.apply_ops()
    assert bad.result.startswith("error: ") and "nests 1501 levels deep" in bad.result
    tracker.flush()
    tags = MlflowClient(tracker.uri).get_run(run_id).data.tags
    assert "rapidfire.op" not in tags  # consumed: a re-run does not meet it again
    assert "nests 1501 levels deep" in tags["rapidfire.op.result"]
    # A later op on the same run is applied.
    tracker.client.set_tag(run_id, "rapidfire.op", 'clone {"learning_rate": 1e-4}')
    tracker.poll_now()
    (good,) = rf.engine.apply_ops()
    assert good.result == "ok: created run-2"
    rf.train()
    assert [r.status for r in rf.runs] == [RunStatus.COMPLETED] * 3
    parent = MlflowClient(tracker.uri).get_run(tracker.parent_run_id)
    assert parent.info.status == "FINISHED"


def test_an_empty_op_tag_is_answered_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    rf = _trainer(tmp_path / "exp", report_to="mlflow")
    tracker = rf.engine.tracker
    run_id = tracker.run_id("run-1")
    tracker.client.set_tag(run_id, "rapidfire.op", "")
    tracker.poll_now()
    (record,) = rf.engine.apply_ops()
    assert record.result.startswith("error: empty op")
    tracker.flush()
    tags = MlflowClient(tracker.uri).get_run(run_id).data.tags
    assert "rapidfire.op" not in tags and tags["rapidfire.op.result"].startswith("error: empty")


def test_a_deep_inbox_file_among_100_good_ones_is_answered_alone(tmp_path):
    out = tmp_path / "exp"
    rf = _trainer(out)
    inbox = Inbox(Layout(out))
    for _ in range(25):
        inbox.post("run-1", "stop")
        inbox.post("run-1", "resume")
    # Between the posts, in arrival order: a file nested 1500 deep.
    name = f"{time.time_ns():020d}-deadbeef.json"
    (inbox.folder / name).write_text('{"run": "run-1", "op": ' + DEEP + "}")
    for _ in range(25):
        inbox.post("run-1", "stop")
        inbox.post("run-1", "resume")
    rf.train()  # the ops apply at its first boundary, in arrival order
    records = rf.op_log
    assert len(records) == 101
    bad = [r for r in records if r.result.startswith("error")]
    assert len(bad) == 1 and bad[0].run == "" and "nests" in bad[0].result  # the reason
    assert all(r.result.startswith("ok: ") for r in records if r is not bad[0])
    assert len(_ops(out)) == 101  # every op logged, the bad one with its answer
    assert inbox.waiting() == 0  # each removed once answered, none before
    assert [r.status for r in rf.runs] == [RunStatus.COMPLETED] * 2


def test_an_inbox_op_stays_until_it_is_answered(tmp_path):
    inbox = Inbox(Layout(tmp_path))
    path = inbox.post("run-0", "stop")
    (taken,) = inbox.take()
    assert taken.run == "run-0" and taken.op == "stop" and path.exists()
    inbox.done(taken)
    assert not path.exists() and inbox.take() == []


def test_a_deep_clone_recipe_fails_that_run_alone(tmp_path):
    out = tmp_path / "exp"
    _trainer(out).train()
    path, doc = read_state(out)
    add_run(doc, "run-2", {"parent": "run-0", "op": 'clone {"learning_rate": ' + DEEP + "}"})
    path.write_text(json.dumps(doc))
    again = _trainer(out)
    with pytest.warns(RuntimeWarning, match="cannot rebuild clone run-2"):
        again.train()
    runs = {r.name: r for r in again.runs}
    assert runs["run-2"].status == RunStatus.FAILED and "nests 1501" in runs["run-2"].error
    assert runs["run-0"].status == runs["run-1"].status == RunStatus.COMPLETED


def test_a_state_file_nested_past_the_bound_is_one_clear_error(tmp_path):
    out = tmp_path / "exp"
    _trainer(out).train()
    path, doc = read_state(out)
    text = json.dumps(doc).replace('"knobs": {', '"knobs": {"x": ' + DEEP + ", ", 1)
    path.write_text(text)
    with pytest.raises(RFConfigError, match="scheduler.json is not a valid scheduler state.*"
                                            "nests 150"):
        _trainer(out)


def test_a_journal_line_setting_attributes_or_naming_paths_is_refused(tmp_path):
    out = tmp_path / "exp"
    _trainer(out).train()
    journal = out / ".rapidfire" / "scheduler.journal"
    _, doc = read_state(out)
    record = dict(doc["runs"]["run-1"], name="../../../x")
    for line in ({"set": {"__dict__": {"fingerprint": "0" * 12}}},
                 {"set": {"runs": {"run-1": record}}}):
        before = journal.read_bytes()
        with open(journal, "a") as fh:
            fh.write(json.dumps(line) + "\n")
        with pytest.raises(RFConfigError, match="edited or damaged"):
            _trainer(out)
        journal.write_bytes(before)
    assert not (tmp_path / "x").exists()
    _trainer(out).train()  # the restored journal continues


# ----------------------------------------------------------------------- links


def test_an_inbox_that_is_a_link_is_refused_before_training(tmp_path):
    out, victim = tmp_path / "exp", _victim(tmp_path)
    (out / ".rapidfire").mkdir(parents=True)
    (out / ".rapidfire" / "inbox").symlink_to(victim)
    with pytest.raises(RFConfigError, match="inbox leads out of"):
        _trainer(out)
    _unchanged(victim)


class _PlantInboxLink(TrainerCallback):
    """At its first step, run-0's inbox becomes a link to the victim folder."""

    def __init__(self, out: Path, victim: Path) -> None:
        self.inbox, self.victim = out / ".rapidfire" / "inbox", victim

    def on_step_end(self, args, state, control, **kwargs):
        if not self.inbox.is_symlink():
            if self.inbox.exists():
                self.inbox.rmdir()
            self.inbox.symlink_to(self.victim)


def test_an_inbox_turned_into_a_link_while_training_is_not_read(tmp_path):
    out, victim = tmp_path / "exp", _victim(tmp_path)
    rf = _trainer(out, callbacks=[_PlantInboxLink(out, victim)])
    rf.train()
    _unchanged(victim)
    assert [r.status for r in rf.runs] == [RunStatus.COMPLETED] * 2
    answered = [row for row in _ops(out) if "leads out of" in row["result"]]
    assert len(answered) == 1 and answered[0]["result"].startswith("error: the inbox is not read")


def test_an_op_file_that_is_a_link_is_not_read(tmp_path):
    out, victim = tmp_path / "exp", _victim(tmp_path)
    rf = _trainer(out)
    inbox = Layout(out).inbox
    inbox.mkdir(parents=True)
    (inbox / "00000000000000000001-link.json").symlink_to(victim / "keep.json")
    (record,) = rf.engine.apply_ops()
    assert record.result.startswith("error") and "symbolic link" in record.result
    assert not (inbox / "00000000000000000001-link.json").exists()  # the link went
    _unchanged(victim)  # its target did not, and was never applied (run-0 not deleted)
    rf.train()
    assert [r.status for r in rf.runs] == [RunStatus.COMPLETED] * 2


@pytest.mark.parametrize("name", ["ops.csv", "schedule.csv", "runs", "previous"])
def test_a_link_where_the_experiment_keeps_a_file_or_folder_is_refused(tmp_path, name):
    out, victim = tmp_path / "exp", _victim(tmp_path)
    out.mkdir()
    target = victim / "keep.txt" if name.endswith(".csv") else victim
    (out / name).symlink_to(target)
    with pytest.raises(RFConfigError, match="symbolic link|leads out of"):
        _trainer(out)
    _unchanged(victim)


def test_an_op_log_turned_into_a_link_while_training_is_never_written(tmp_path):
    out, victim = tmp_path / "exp", _victim(tmp_path)
    rf = _trainer(out)
    rf.stop("run-1")
    rf.engine.apply_ops()  # ops.csv exists now
    (out / "ops.csv").unlink()
    (out / "ops.csv").symlink_to(victim / "keep.txt")
    rf.resume("run-1")
    with pytest.raises(ValueError, match="ops.csv is a symbolic link"):
        rf.train()
    _unchanged(victim)


def test_previous_as_a_link_moves_nothing_out(tmp_path):
    out, victim = tmp_path / "exp", _victim(tmp_path)
    _trainer(out).train()
    (out / "previous").symlink_to(victim)
    with pytest.raises(RFConfigError, match="previous leads out of"):
        _trainer(out, lrs=(1e-2, 2e-2))  # another experiment: would be moved aside
    _unchanged(victim)
    assert (out / ".rapidfire" / "scheduler.json").is_file()  # nothing moved


def test_the_report_reads_no_run_named_outside_the_folder(tmp_path):
    from trl_rapidfire.reports.experiment_data import load_experiment

    out = tmp_path / "a" / "b" / "exp"
    _trainer(out).train()
    outside = tmp_path / "a" / "x" / "final"
    outside.mkdir(parents=True)
    (outside / "trainer_state.json").write_text(json.dumps(
        {"log_history": [{"step": 1, "loss": 123.0}]}))
    with open(out / "schedule.csv", "a") as fh:
        fh.write("../../../x,0,0,0,0,0.0,1.0,0,1,1\n")
    data = load_experiment(out)
    assert sorted(data.runs) == ["run-0", "run-1"]
    assert all("../" not in c.run for c in data.schedule)


# ----------------------------------------------------------------------- runs and folders


def test_a_diverged_run_fails_with_a_reason_and_is_never_best(tmp_path):
    out = tmp_path / "exp"
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 1e300]), num_chunks=4,
                         max_steps=8, report_to="none", **BASE),
        train_dataset=make_sft_dataset(32), peft_config=tiny_lora_config(r=4))
    with pytest.warns(RuntimeWarning, match="run-1 diverged: .* at step"):
        rf.train()
    runs = {r.name: r for r in rf.runs}
    assert runs["run-1"].status == RunStatus.FAILED and "diverged" in runs["run-1"].error
    assert runs["run-0"].status == RunStatus.COMPLETED
    assert rf.best_run.name == "run-0"
    assert not (out / "runs" / "run-1" / "final").exists()  # no adapter of nan was kept
    weights = load_file(out / "runs" / "run-0" / "final" / "adapter_model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert math.isfinite(runs["run-0"].metrics["loss"])


def test_a_second_script_on_a_training_folder_is_refused(tmp_path):
    out = tmp_path / "exp"
    first = _trainer(out, callbacks=[_Slow()])
    first.train(blocking=False)
    try:
        deadline = time.time() + 60
        while not (out / ".rapidfire" / "scheduler.json").exists() and time.time() < deadline:
            time.sleep(0.05)
        with pytest.raises(RFConfigError, match="training now: this process"):
            _trainer(out, lrs=(5e-3, 7e-3))  # other runs: it would be moved aside
    finally:
        first.wait()
    assert [r.status for r in first.runs] == [RunStatus.COMPLETED] * 2
    assert not (out / "previous").exists()
    # Once it has ended, the other experiment takes the folder (the first is moved aside).
    with pytest.warns(UserWarning, match="moved, whole"):
        _trainer(out, lrs=(5e-3, 7e-3))


def test_a_live_process_elsewhere_on_this_machine_is_named(tmp_path):
    import socket
    import subprocess
    import sys

    from trl_rapidfire.control.folder_control import training_now

    out = tmp_path / "exp"
    layout = Layout(out)
    layout.state_dir.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        layout.alive_file.write_text(json.dumps(
            {"host": socket.gethostname(), "pid": sleeper.pid, "since": time.time()}))
        assert f"process {sleeper.pid} on this machine" in training_now(layout, None)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert training_now(layout, None) is None  # dead: its folder may be moved aside
    layout.alive_file.write_text(json.dumps({"host": socket.gethostname(), "pid": -1,
                                             "since": 0}))
    assert training_now(layout, None) is None  # never kill(-1, 0): not a process


class _Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.3)


def test_leftovers_of_a_killed_final_save_go_once_the_final_is_written(tmp_path):
    out = tmp_path / "exp"
    # What a kill during a run's final save leaves (a process that is gone, by its pid).
    stale = out / "runs" / "run-0" / ".tmp-final-999999"
    stale.mkdir(parents=True)
    (stale / "adapter_model.safetensors").write_bytes(b"half")
    _trainer(out).train()
    assert sorted(os.listdir(out / "runs" / "run-0")) == ["final"]


def test_deep_params_of_a_proposed_run_fail_that_run_alone(tmp_path):
    pytest.importorskip("optuna")
    from trl_rapidfire import Range
    from trl_rapidfire.integrations.optuna.search import OptunaSearch

    out = tmp_path / "exp"

    def build():
        return RFSFTTrainer(
            model=tiny_model_path(),
            args=RFSFTConfig(output_dir=str(out), num_chunks=2, max_steps=2, report_to="none",
                             learning_rate=Range(1e-4, 1e-2, log=True), **BASE),
            train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4),
            search=OptunaSearch(num_runs=2, max_concurrent=1, metric="loss"))

    build().train()
    path, doc = read_state(out)
    add_run(doc, "run-2", {"trial": "2", "params": '{"learning_rate": ' + DEEP + "}"})
    path.write_text(json.dumps(doc))
    again = build()
    with pytest.warns(RuntimeWarning, match="cannot rebuild run-2"):
        again.train()
    runs = {r.name: r for r in again.runs}
    assert runs["run-2"].status == RunStatus.FAILED and "nests 1501" in runs["run-2"].error
    assert runs["run-0"].status == runs["run-1"].status == RunStatus.COMPLETED


@pytest.mark.slow
def test_a_second_script_is_refused_while_the_first_trains_in_another_process(tmp_path):
    import subprocess
    import sys

    from launched import launch_env

    out = tmp_path / "exp"
    script = Path(__file__).resolve().parents[1] / "experiment_script.py"
    first = subprocess.Popen([sys.executable, str(script), str(out)],
                             env=launch_env(tmp_path, RF_TEST_ROWS="800"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        alive = out / ".rapidfire" / "alive.json"
        deadline = time.time() + 120
        while not alive.exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert alive.exists(), first.communicate()[0][-3000:]
        with pytest.raises(RFConfigError, match=f"training now: process {first.pid} on this "
                                                "machine"):
            _trainer(out, lrs=(5e-3, 7e-3))
    finally:
        log = first.communicate(timeout=600)[0]
    assert first.returncode == 0, log[-3000:]
    assert not (out / "previous").exists()
    _, doc = read_state(out)
    assert {r["status"] for r in doc["runs"].values()} == {"completed"}


def test_the_inbox_is_read_only_when_its_folder_changed(tmp_path):
    """Asked at every boundary, the inbox answers from one stat while its folder is as it was
    when a read found it empty; an op posted after is seen at the next ask."""
    inbox = Inbox(Layout(tmp_path))
    assert not inbox.has_mail()  # no folder yet
    inbox.post("run-1", "stop")
    assert inbox.has_mail()
    inbox.done(inbox.take()[0])
    reads = []
    original = inbox.waiting
    inbox.waiting = lambda: reads.append(1) or original()
    assert not inbox.has_mail() and reads == [1]  # changed by the removal: read
    old = time.time() - 60
    os.utime(inbox.folder, (old, old))  # as a folder left alone for a minute
    assert not inbox.has_mail() and reads == [1, 1]  # its time moved: read once more
    for _ in range(3):
        assert not inbox.has_mail()
    assert reads == [1, 1]  # unchanged since it was read empty: not read again
    inbox.post("run-2", "resume")
    assert inbox.has_mail() and reads == [1, 1, 1]
    os.utime(inbox.folder, (old, old))
    assert inbox.has_mail()  # not empty when last read: read again, whatever its time
