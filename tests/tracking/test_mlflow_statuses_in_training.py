"""MLflow's own status column is calm and true after real training (docs/ic-ops.md,
"Tracking"): a run a policy (or a person) stopped ends FINISHED, its status tag ``stopped``
and ``rapidfire.stopped_by`` naming who; after a Ctrl-C (once or twice) or a ``train()`` that
ends on an error, no run reads RUNNING: the runs in the rotation are KILLED (interrupted), the
runs that never trained SCHEDULED; a re-run sets every run right. Real MLflow on a sqlite
store in the test's folder."""

from __future__ import annotations

import pytest
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer, SuccessiveHalving
from trl_rapidfire.shared_state.runs import INTERRUPTED, RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)
from trl_rapidfire.tracking.tags import STATUS_TAG, STOPPED_BY_TAG


@pytest.fixture
def store(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _trainer(out, lrs, *, chunks, rows, policy=None, callbacks=None):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(list(lrs)), num_chunks=chunks,
                         num_train_epochs=1, per_device_train_batch_size=4,
                         eval_strategy="policy" if policy else "no",
                         per_device_eval_batch_size=8,
                         **{**cpu_training_kwargs(), "report_to": "mlflow"}),
        train_dataset=make_sft_dataset(rows, seed=1),
        eval_dataset=make_sft_dataset(8, seed=9) if policy else None,
        peft_config=tiny_lora_config(r=4), policy=policy, callbacks=callbacks,
    )


def _runs(uri):
    """Run name -> (MLflow status, end time, tags) of the experiment ``exp``'s RF runs."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "exp"]
    return {r.data.tags["rapidfire.run"]: (r.info.status, r.info.end_time, r.data.tags)
            for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get("rapidfire.role") == "run"}


def test_runs_a_policy_or_a_person_stopped_are_finished_and_say_who(tmp_path, store):
    # Before: every stopped run was KILLED (MLflow's red), and nothing said who stopped it.
    rf = _trainer(tmp_path / "exp", (1e-6, 1e-2, 8e-3, 6e-3, 4e-3), chunks=2, rows=16,
                  policy=SuccessiveHalving("eval_loss", "min", eta=2))
    rf.stop("run-4")  # a person, from Python, before it trains
    rf.train()
    by_policy = {o.run for o in rf.op_log if o.source == "policy:SuccessiveHalving"
                 and o.result.startswith("ok: stopped")}
    assert by_policy  # the halving stopped losers at its rung
    runs = _runs(store)
    for name, (status, ended, tags) in runs.items():
        rf_status = {r.name: r.status for r in rf.runs}[name]
        assert (status, ended is not None) == ("FINISHED", True), (name, status)
        assert tags[STATUS_TAG] == rf_status.value
        if name in by_policy:
            assert (rf_status, tags[STOPPED_BY_TAG]) == (RunStatus.STOPPED, "SuccessiveHalving")
        elif name == "run-4":
            assert (rf_status, tags[STOPPED_BY_TAG]) == (RunStatus.STOPPED, "person (python)")
        else:
            assert rf_status == RunStatus.COMPLETED and STOPPED_BY_TAG not in tags

    # Resumed, it runs again and nothing says it is stopped; completed, it is FINISHED again.
    loser = sorted(by_policy)[0]
    rf.resume(loser)
    rf.train()
    status, _, tags = _runs(store)[loser]
    assert (status, tags[STATUS_TAG]) == ("FINISHED", "completed")
    assert STOPPED_BY_TAG not in tags


class _Interrupt(TrainerCallback):
    """At run-1's first step: a Ctrl-C (``hard``: pressed twice, KeyboardInterrupt now)."""

    trainer = None

    def __init__(self, hard: bool) -> None:
        self.hard = hard

    def on_step_begin(self, args, state, control, **kwargs):
        if args.output_dir.endswith("run-1") and state.global_step == 1:
            if self.hard:
                raise KeyboardInterrupt
            self.trainer.engine.interrupted = True  # what the first Ctrl-C's handler sets


def _check_none_running(uri, rf):
    runs = _runs(uri)
    statuses = {name: status for name, (status, _, _) in runs.items()}
    assert "RUNNING" not in statuses.values(), statuses
    for run in rf.runs:
        status, ended, tags = runs[run.name]
        if run.status == RunStatus.PENDING:  # never trained: waiting for its first chunk
            assert (status, ended, tags[STATUS_TAG]) == ("SCHEDULED", None, "pending")
        else:  # in the rotation: cut short
            assert run.status == RunStatus.RUNNING
            assert (status, tags[STATUS_TAG]) == ("KILLED", INTERRUPTED)
    return statuses


@pytest.mark.parametrize("hard", [False, True], ids=["ctrl-c", "ctrl-c-twice"])
def test_after_a_ctrl_c_no_run_reads_running_and_a_rerun_finishes_them(tmp_path, store, hard):
    # Before: the runs that had not trained yet still read RUNNING after the Ctrl-C.
    out = tmp_path / "exp"
    first = _trainer(out, (1e-3, 2e-3, 3e-3, 4e-3, 5e-3), chunks=4, rows=32,
                     callbacks=[_Interrupt(hard)])
    _Interrupt.trainer = first
    with pytest.raises(KeyboardInterrupt):
        first.train()
    statuses = _check_none_running(store, first)
    assert "SCHEDULED" in statuses.values() and "KILLED" in statuses.values()

    _trainer(out, (1e-3, 2e-3, 3e-3, 4e-3, 5e-3), chunks=4, rows=32).train()  # the re-run
    runs = _runs(store)
    assert {n: (s, t[STATUS_TAG]) for n, (s, _, t) in runs.items()} == {
        f"run-{i}": ("FINISHED", "completed") for i in range(5)}


def test_a_train_that_ends_on_an_error_leaves_no_run_running(tmp_path, store):
    rf = _trainer(tmp_path / "exp", (1e-3, 2e-3, 3e-3, 4e-3), chunks=4, rows=32)
    boundaries = []

    def fails_at_the_third_boundary():
        boundaries.append(len(rf.schedule))
        if len(boundaries) == 3:
            raise RuntimeError("the script's own bug")

    rf.engine.hooks.at_boundary = fails_at_the_third_boundary
    with pytest.raises(RuntimeError, match="the script's own bug"):
        rf.train()
    statuses = _check_none_running(store, rf)
    assert sorted(statuses.values()) == ["KILLED", "KILLED", "SCHEDULED", "SCHEDULED"]
