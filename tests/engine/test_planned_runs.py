"""Runs built when first scheduled: a run that differs from the first one built only in knobs
that leave its data and chunk plan alone (learning rate, schedule, LoRA settings, ...) is
registered with that plan and its trainer is built at its first turn, so the first chunk does
not wait for every run's trainer. Validation stays up front, and the runs end as if built
before training (bitwise: tests/engine/test_engine_exactness.py trains such runs)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.search.searches import SearchError
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

LRS = [1e-3, 3e-3, 1e-2]
BASE = dict(cpu_training_kwargs(), per_device_train_batch_size=4, num_train_epochs=1,
            logging_steps=1, num_chunks=2)


def _experiment(out, *, callbacks=None, **overrides):
    kwargs = dict(BASE, learning_rate=List(LRS))
    kwargs.update(overrides)
    peft = kwargs.pop("peft_config", tiny_lora_config(r=4, lora_dropout=0.1))
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), **kwargs),
        train_dataset=make_sft_dataset(32, seed=1),  # 8 steps, 2 chunks of 4
        peft_config=peft, callbacks=callbacks,
    )


def _planned(rf):
    return sorted(name for name, slot in rf.engine.slots.items() if slot.planned)


def test_only_the_first_run_is_built_before_training_and_each_other_at_its_first_turn(tmp_path):
    seen = []

    class LookAtTheOthers(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                seen.append((args.output_dir.rsplit("/", 1)[-1], _planned(rf)))

    rf = _experiment(tmp_path / "exp", callbacks=[LookAtTheOthers()])
    assert _planned(rf) == ["run-1", "run-2"]
    # What a user reads before training is the same as for a built run.
    before = {r.name: (r.status, r.global_step, r.metrics) for r in rf.runs}
    assert before["run-1"] == (RunStatus.PENDING, 0, {})
    assert len(rf.engine.slots["run-1"].plan) == len(rf.engine.slots["run-0"].plan) == 2
    rf.train()
    # Each run's trainer was built at its own first turn, not before the first chunk.
    assert seen == [("run-0", ["run-1", "run-2"]), ("run-1", ["run-2"]), ("run-2", [])]
    assert [r.status for r in rf.runs] == [RunStatus.COMPLETED] * 3
    assert all(r.global_step == 8 for r in rf.runs)


def test_knobs_that_change_the_data_or_the_plan_build_every_run_up_front(tmp_path):
    rf = _experiment(tmp_path / "a", max_length=List([16, 32]))
    assert _planned(rf) == []
    rf = _experiment(tmp_path / "b", per_device_train_batch_size=List([2, 4]))
    assert _planned(rf) == []
    # Full fine-tuning runs start from the base weights as they are when built: up front.
    rf = _experiment(tmp_path / "c", peft_config=None)
    assert _planned(rf) == []


def test_a_bad_value_still_fails_before_anything_trains(tmp_path):
    # Each run's config is made and checked up front, planned or not: the last run's bad
    # values are said at construction, naming the run.
    with pytest.raises(SearchError, match=r"run-1 .*lr_scheduler_type"):
        _experiment(tmp_path / "a", lr_scheduler_type=List(["linear", "no-such-schedule"]),
                    learning_rate=List([1e-3, 1e-2]))
    with pytest.raises(SearchError, match=r"run-2 .*learning_rate.*out of range"):
        _experiment(tmp_path / "b", learning_rate=List([1e-3, 1e-2, -1.0]))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_planned_run_that_cannot_be_built_fails_alone_and_the_others_train(tmp_path):
    good = tiny_lora_config(r=4)
    bad = tiny_lora_config(r=4, target_modules=("no_such_module",))
    rf = _experiment(tmp_path / "exp", learning_rate=1e-3, peft_config=List([good, bad]))
    assert _planned(rf) == ["run-1"]
    with pytest.warns(RuntimeWarning, match="run-1"):
        rf.train()
    runs = {r.name: r for r in rf.runs}
    assert runs["run-0"].status == RunStatus.COMPLETED
    assert runs["run-1"].status == RunStatus.FAILED
    assert "no_such_module" in runs["run-1"].error
    assert rf.run_trainer("run-1") is None  # as for a run that failed before training


def test_callbacks_added_before_training_reach_the_runs_built_later(tmp_path):
    began = []

    class Began(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            began.append(args.output_dir.rsplit("/", 1)[-1])

    class Removed(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            raise AssertionError("removed before training")

    rf = _experiment(tmp_path / "exp", callbacks=[Removed()])
    rf.add_callback(Began())
    rf.remove_callback(Removed)
    rf.train()
    assert sorted(began) == ["run-0", "run-1", "run-2"]


def test_a_runs_trainer_asked_for_is_built_then_but_never_from_inside_a_run(tmp_path):
    refused = []

    class AskForRun2(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if args.output_dir.endswith("run-0") and state.global_step == 0:
                try:
                    rf.run_trainer("run-2")
                except RuntimeError as err:
                    refused.append(str(err))

    rf = _experiment(tmp_path / "exp", callbacks=[AskForRun2()])
    assert rf.run_trainer("run-1") is rf.engine.slots["run-1"].trainer is not None
    assert _planned(rf) == ["run-2"]
    rf.train()
    assert refused and "first scheduled" in refused[0]
    assert [r.status for r in rf.runs] == [RunStatus.COMPLETED] * 3


def test_a_rerun_serves_the_best_run_finished_earlier_from_its_files(tmp_path):
    out = tmp_path / "exp"
    first = _experiment(out)
    first.train()
    best = first.best_run.name
    assert best != "run-0"  # a planned run in the re-run
    second = _experiment(out)
    assert best in _planned(second)
    second.train()  # nothing left to train; the best run is made the live one, from disk
    assert second.best_run.name == best and not second.engine.slots[best].planned
    second.save_model(str(tmp_path / "best"))
    want = load_file(out / "runs" / best / "final" / "adapter_model.safetensors")
    got = load_file(tmp_path / "best" / "adapter_model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)



def test_a_planned_runs_recorded_config_is_what_a_built_runs_would_be(tmp_path, monkeypatch):
    # MLflow records each run's config (and `trl-rapidfire status` shows the fields that
    # differ as knobs): the runs built at their first turn differ from the first one, built
    # up front, in their knobs and folders only.
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    rf = _experiment(tmp_path / "exp", report_to="mlflow")
    assert _planned(rf) == ["run-1", "run-2"]
    rf.train()
    client = MlflowClient(uri)
    params = {}
    for name in ("run-0", "run-1"):
        params[name] = client.get_run(rf.engine.tracker.run_id(name)).data.params
    differ = {k for k in params["run-0"] | params["run-1"]
              if params["run-0"].get(k) != params["run-1"].get(k)}
    assert "learning_rate" in differ and differ <= {"learning_rate", "output_dir", "logging_dir"}


def test_a_planned_runs_trainer_is_not_built_from_another_thread_while_training(tmp_path):
    import threading

    gate, release, answers = threading.Event(), threading.Event(), []

    class Hold(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if args.output_dir.endswith("run-0") and state.global_step == 1:
                gate.set()
                release.wait(timeout=60)

    rf = _experiment(tmp_path / "exp", callbacks=[Hold()])
    rf.train(blocking=False)
    try:
        assert gate.wait(timeout=120)
        try:  # the notebook's thread, say, while the engine trains run-0
            rf.run_trainer("run-2")
        except RuntimeError as err:
            answers.append(str(err))
        assert rf.engine.slots["run-2"].planned  # the shared model was left alone
    finally:
        release.set()
        rf.wait(timeout=300)
    assert answers and "is training" in answers[0]
    assert rf.run_trainer("run-2") is not None  # after train(): its trainer exists
