"""train(blocking=False): the experiment trains on a thread while the caller (a notebook)
issues ops, reads the runs, and waits."""

from __future__ import annotations

import time

import pytest
import torch
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


def _trainer(out, lrs=(1e-3, 3e-3, 1e-2), **more):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(list(lrs)), num_chunks=4,
                         per_device_train_batch_size=4, num_train_epochs=1,
                         **{**cpu_training_kwargs(), **more}),
        train_dataset=make_sft_dataset(48, seed=1),
        peft_config=tiny_lora_config(r=4),
    )


def _until(condition, timeout=120.0):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def test_a_notebook_stops_and_clones_while_the_experiment_trains(tmp_path):
    rf = _trainer(tmp_path / "exp")
    assert rf.train(blocking=False) is None
    assert rf.training
    with pytest.raises(RuntimeError, match="already training"):
        rf.train()
    # Once every run has trained a chunk, steer it as a person in a notebook would.
    _until(lambda: len(rf.schedule) >= 3)
    rf.stop("run-1")
    rf.clone("run-2", {"learning_rate": 5e-3})
    seen = rf.runs  # readable while it trains
    assert [r.name for r in seen][:3] == ["run-0", "run-1", "run-2"]
    out = rf.wait()
    assert not rf.training
    assert out.global_step == rf.best_run.global_step
    runs = {r.name: r for r in rf.runs}
    assert runs["run-1"].status == RunStatus.STOPPED and 0 < runs["run-1"].global_step < 12
    assert runs["run-3"].knobs["learning_rate"] == 5e-3
    assert runs["run-3"].status == RunStatus.COMPLETED
    assert [o.result.split(" ")[:2] for o in rf.op_log] == [["ok:", "stopped"],
                                                          ["ok:", "created"]]
    # Training on a thread changes nothing: run-0 ends as it does in a blocking train().
    ref = _trainer(tmp_path / "ref", lrs=(1e-3,))
    ref.train()
    got = load_file(tmp_path / "exp/runs/run-0/final/adapter_model.safetensors")
    want = load_file(tmp_path / "ref/runs/run-0/final/adapter_model.safetensors")
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_wait_says_it_timed_out_and_raises_what_train_raised(tmp_path):
    rf = _trainer(tmp_path / "exp", lrs=(1e-3,))
    with pytest.raises(RuntimeError, match="nothing to wait for"):
        rf.wait()
    rf.train(blocking=False)
    with pytest.raises(TimeoutError, match=r"still training after 0 s \(\d+ of \d+ chunks "
                                           r"trained\); it trains on"):
        rf.wait(timeout=0)
    assert rf.training  # a timed-out wait leaves it training
    out = rf.wait()
    assert out is not None and out.global_step == rf.best_run.global_step
    # Bad arguments fail at once, as in a blocking call.
    with pytest.raises(ValueError, match="resume a whole experiment"):
        rf.train(blocking=False, resume_from_checkpoint="some/checkpoint")


class _Explode(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        raise RuntimeError("boom")


def test_what_fails_in_the_background_is_raised_by_wait(tmp_path):
    from trl_rapidfire.engine import RunFailure

    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List([1e-3, 3e-3]),
                         num_chunks=2, per_device_train_batch_size=4, **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(16, seed=1), peft_config=tiny_lora_config(r=4),
        callbacks=[_Explode()],
    )
    with pytest.warns(RuntimeWarning, match="boom"):
        rf.train(blocking=False)
        with pytest.raises(RunFailure, match=r"(?s)Every run failed:.*boom"):
            rf.wait()
    assert not rf.training


def test_a_stopped_run_is_never_best_over_a_completed_one(tmp_path):
    rf = _trainer(tmp_path / "exp", lrs=(1e-3, 3e-3), logging_steps=1)
    rf.train(blocking=False)
    _until(lambda: len(rf.schedule) >= 2)
    rf.stop("run-1")
    out = rf.wait()
    runs = {r.name: r for r in rf.runs}
    assert runs["run-1"].status == RunStatus.STOPPED
    assert runs["run-1"].global_step < runs["run-0"].global_step
    # Whichever way the metric points, make the stopped run the better one by it: the
    # completed run is still the best, and train()/wait() returned its output.
    stopped_higher = runs["run-1"].metrics["loss"] > runs["run-0"].metrics["loss"]
    rf.args.metric_for_best_model, rf.args.greater_is_better = "loss", stopped_higher
    assert rf.best_run.name == "run-0", (runs, rf.args.metric_for_best_model)
    assert out.global_step == runs["run-0"].global_step


def test_wait_returns_where_a_stopped_best_run_got_to(tmp_path):
    rf = _trainer(tmp_path / "exp", lrs=(1e-3,), logging_steps=1)
    rf.train(blocking=False)
    _until(lambda: len(rf.schedule) >= 1)
    rf.stop("run-0")
    out = rf.wait()  # was None: the only (best) run never finished its train()
    (run,) = rf.runs
    assert run.status == RunStatus.STOPPED and out is not None
    assert out.global_step == run.global_step < 12
    history = rf.run_trainer("run-0").state.log_history
    losses = [e["loss"] for e in history if "loss" in e]
    assert out.training_loss == pytest.approx(sum(losses) / len(losses))


def test_a_rerun_of_a_finished_experiment_returns_the_trainers_own_train_loss(tmp_path):
    first = _trainer(tmp_path / "exp", lrs=(1e-3,), logging_steps=1).train()
    again = _trainer(tmp_path / "exp", lrs=(1e-3,), logging_steps=1).train()  # nothing left
    assert again.global_step == first.global_step
    assert again.training_loss == first.training_loss  # the Trainer's, not a mean rebuilt
