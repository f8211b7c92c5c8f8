"""MLflow tracking into a real sqlite store, and control ops from run tags and from Python."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BASE = dict(cpu_training_kwargs(), per_device_train_batch_size=4, logging_steps=1,
            report_to="mlflow")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


@pytest.fixture(scope="module")
def model_path():
    return tiny_model_path()


def _trainer(model_path, out, lrs=(1e-3, 3e-3), callbacks=None, **kw):
    args = dict(BASE, num_chunks=4, max_steps=8)
    args.update(kw)
    return RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(list(lrs)), **args),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
        callbacks=callbacks,
    )


def _children(client, trainer):
    tracker = trainer.engine.tracker
    runs = client.search_runs(
        [tracker.experiment_id],
        filter_string=f"tags.`rapidfire.role` = 'run' and "
                      f"tags.`rapidfire.experiment` = '{tracker.rf_experiment}'",
    )
    return {r.data.tags["rapidfire.run"]: r for r in runs}


def _adapter(path: Path) -> dict[str, torch.Tensor]:
    return load_file(Path(path) / "adapter_model.safetensors")


def test_metrics_params_and_tags_land_in_sqlite_and_a_rerun_continues_the_same_runs(
    model_path, tmp_path
):
    rf = _trainer(model_path, tmp_path / "exp")
    rf.train()
    tracker = rf.engine.tracker
    client = MlflowClient(tracker.uri)
    assert client.get_experiment(tracker.experiment_id).name == "exp"
    children = _children(client, rf)
    assert set(children) == {"run-0", "run-1"}
    for name, run in children.items():
        assert run.info.status == "FINISHED"
        assert run.data.tags["rapidfire.status"] == "completed"
        assert run.data.tags["mlflow.parentRunId"] == tracker.parent_run_id
        assert run.data.tags["rapidfire.progress"] == "done 4/4 (step 8/8)"
        assert float(run.data.params["learning_rate"]) in (1e-3, 3e-3)
        history = client.get_metric_history(run.info.run_id, "loss")
        assert sorted(m.step for m in history) == list(range(1, 9))  # one point per step
        logged = [e["loss"] for e in rf.run_trainer(name).state.log_history if "loss" in e]
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(logged)
    assert not tracker.errors

    # The same script again on the same folder: same MLflow runs, no duplicate points.
    again = _trainer(model_path, tmp_path / "exp")
    again.train()
    children2 = _children(client, again)
    assert {n: r.info.run_id for n, r in children2.items()} == {
        n: r.info.run_id for n, r in children.items()
    }
    for run in children2.values():
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
        assert sorted(steps) == list(range(1, 9))

    # Another folder with the same base name is another experiment's runs.
    other = _trainer(model_path, tmp_path / "elsewhere" / "exp", lrs=(1e-3,))
    assert other.engine.tracker.rf_experiment != tracker.rf_experiment
    other.engine.tracker.flush()  # its runs are made on the tracking thread, not at once
    assert set(_children(client, other)) == {"run-0"}


class _SetTagAt(TrainerCallback):
    """At ``step`` of the run with learning rate ``lr``, a person sets a tag on ``target``."""

    def __init__(self, lr, step, target, op):
        self.lr, self.step, self.target, self.op = lr, step, target, op
        self.trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate == self.lr and state.global_step == self.step:
            tracker = self.trainer.engine.tracker
            tracker.client.set_tag(tracker.run_id(self.target), "rapidfire.op", self.op)
            tracker.poll_now()


def test_stop_by_tag_then_resume_continues_exactly(model_path, tmp_path):
    tag = _SetTagAt(lr=1e-3, step=4, target="run-1", op="stop")
    rf = _trainer(model_path, tmp_path / "exp", callbacks=[tag])
    for name in rf.engine.slots:  # each run's trainer, built now if it was planned
        next(cb for cb in rf.run_trainer(name).callback_handler.callbacks
             if isinstance(cb, _SetTagAt)).trainer = rf
    rf.train()
    runs = {r.name: r for r in rf.runs}
    assert runs["run-0"].status == RunStatus.COMPLETED
    assert runs["run-1"].status == RunStatus.STOPPED and runs["run-1"].global_step == 4
    client = MlflowClient(rf.engine.tracker.uri)
    child = _children(client, rf)["run-1"]
    assert "rapidfire.op" not in child.data.tags
    assert child.data.tags["rapidfire.op.result"] == "ok: stopped at step 4"
    assert child.data.tags["rapidfire.op.seq"] == "1"  # the run's first answered op
    assert child.data.tags["rapidfire.status"] == "stopped"
    assert [(r.source, r.run, r.op, r.result) for r in rf.op_log] == [
        ("tag", "run-1", "stop", "ok: stopped at step 4")]
    assert (tmp_path / "exp" / "ops.csv").read_text().count("\n") == 2

    rf.resume("run-1")
    rf.train()
    assert {r.name: r.status for r in rf.runs}["run-1"] == RunStatus.COMPLETED
    ref = _trainer(model_path, tmp_path / "ref", lrs=(3e-3,), report_to="none")
    ref.train()
    got = _adapter(tmp_path / "exp/runs/run-1/final")
    want = _adapter(tmp_path / "ref/runs/run-0/final")
    assert all(torch.equal(got[k], want[k]) for k in want)


class _Snapshot(TrainerCallback):
    """Keeps each run's trainable weights as they are when its train() begins."""

    seen: dict[str, dict[str, torch.Tensor]] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        _Snapshot.seen[args.output_dir] = {
            n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad
        }


def test_clone_warm_starts_from_the_parents_last_chunk_and_clone_starts_fresh(
    model_path, tmp_path
):
    _Snapshot.seen.clear()
    rf = _trainer(model_path, tmp_path / "exp", save_strategy="chunk", callbacks=[_Snapshot()])
    rf.train()  # both runs complete; then clone the completed winner
    rf.clone("run-0", {"learning_rate": 1e-4}, warm=True)
    rf.clone("run-0", {"peft_config.r": 8})
    rf.train()
    runs = {r.name: r for r in rf.runs}
    assert runs["run-2"].knobs["learning_rate"] == 1e-4 and runs["run-2"].status == "completed"
    assert runs["run-3"].knobs["peft_config"].r == 8
    assert [r.result for r in rf.op_log] == ["ok: created run-2 warm-started from run-0",
                                             "ok: created run-3"]
    # The warm clone started from run-0's adapter at its last finished chunk (its final one).
    start = _Snapshot.seen[str(tmp_path / "exp" / "runs" / "run-2")]
    parent = _adapter(tmp_path / "exp/runs/run-0/final")
    assert len(start) == len(parent)
    for (name, value), key in zip(sorted(start.items()), sorted(parent)):
        assert torch.equal(value, parent[key]), name
    assert rf.run_trainer("run-2").state.global_step == 8  # its own full schedule
    assert rf.run_trainer("run-2").args.learning_rate == 1e-4
    # The cold clone has rank 8 and a fresh adapter (B starts at zero).
    fresh = _Snapshot.seen[str(tmp_path / "exp" / "runs" / "run-3")]
    assert all(v.shape[0] == 8 or v.shape[1] == 8 for v in fresh.values())
    assert all(not v.any() for k, v in fresh.items() if "lora_B" in k)


def test_warm_clone_mid_flight_copies_the_adapter_at_the_boundary(model_path, tmp_path):
    _Snapshot.seen.clear()
    rf = _trainer(model_path, tmp_path / "exp", save_strategy="chunk", callbacks=[_Snapshot()])
    engine = rf.engine
    state = {"queued": False}

    def queue_after_first_chunk_of_run_0():  # at every chunk boundary
        if not state["queued"] and engine.slots["run-0"].state.chunks_done == 1:
            rf.clone("run-0", {"learning_rate": 2e-4}, warm=True)
            state["queued"] = True

    engine.hooks.at_boundary = queue_after_first_chunk_of_run_0
    rf.train()
    start = _Snapshot.seen[str(tmp_path / "exp" / "runs" / "run-2")]
    ckpt = _adapter(tmp_path / "exp/runs/run-0/checkpoint-2")
    for (name, value), key in zip(sorted(start.items()), sorted(ckpt)):
        assert torch.equal(value, ckpt[key]), name
    assert all(r.status == RunStatus.COMPLETED for r in rf.runs)


def test_clone_warm_of_a_full_fine_tuning_run_starts_from_its_weights(model_path, tmp_path):
    _Snapshot.seen.clear()
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), num_chunks=2, max_steps=4,
                         learning_rate=List([1e-3, 3e-3]), **{**BASE, "report_to": "none"}),
        train_dataset=make_sft_dataset(32),
        callbacks=[_Snapshot()],
    )
    rf.train()
    rf.clone("run-0", {"learning_rate": 1e-4}, warm=True)
    rf.train()
    assert rf.op_log[-1].result == "ok: created run-2 warm-started from run-0"
    start = _Snapshot.seen[str(tmp_path / "exp" / "runs" / "run-2")]
    parent = load_file(tmp_path / "exp/runs/run-0/final/model.safetensors")
    assert set(parent) <= set(start)
    assert all(torch.equal(start[k], parent[k]) for k in parent)
    assert {r.name: r.status for r in rf.runs}["run-2"] == RunStatus.COMPLETED


def test_points_missing_before_later_steps_are_logged_once_on_a_rerun(tmp_path):
    # After a crash, MLflow may hold a run's later steps (logged by another worker) but not
    # its earlier ones (lost with the killed worker's queue): a re-run's tracker must log the
    # missing points and skip the others.
    from mlflow import MlflowClient

    from trl_rapidfire.tracking.tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(tmp_path / "exp", uri=uri, write_interval=0.05)
    first.ensure_run("run-0", {}, {})
    first.log_metrics("run-0", [("loss", float(s), s, 0) for s in range(9, 17)])
    first.flush()
    first.close()
    second = Tracker(tmp_path / "exp", uri=uri, write_interval=0.05)
    second.ensure_run("run-0", {}, {})
    run_id = second.run_id("run-0")
    second.log_metrics("run-0", [("loss", float(s), s, 0) for s in range(1, 17)])
    second.flush()
    second.close()
    steps = sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss"))
    assert steps == list(range(1, 17))


def test_the_progress_tag_counts_the_runs_chunks_over_all_its_epochs():
    from types import SimpleNamespace

    from trl_rapidfire.engine.chunks import plan_chunks
    from trl_rapidfire.engine.reporting import progress_text

    plan = plan_chunks(steps_per_epoch=40, total_steps=80, num_chunks=4)  # 8 chunks of 10

    def text(step, status=RunStatus.RUNNING):
        state = SimpleNamespace(global_step=step, status=status)
        return progress_text(SimpleNamespace(plan=plan, state=state, trainer=object()))

    assert text(0, RunStatus.PENDING) == "chunk 0/8 (epoch 1/2, step 0/80)"
    assert text(30) == "chunk 3/8 (epoch 1/2, step 30/80)"
    # The first epoch just ended: its last chunk, not "epoch 2/2 chunk 0/4".
    assert text(40) == "chunk 4/8 (epoch 1/2, step 40/80)"
    assert text(50, RunStatus.STOPPED) == "chunk 5/8 (epoch 2/2, step 50/80)"
    assert text(80, RunStatus.COMPLETED) == "done 8/8 (step 80/80)"
