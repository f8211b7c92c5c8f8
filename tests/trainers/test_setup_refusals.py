"""Bad input found before anything trains (trust, second pass: the smaller items), each with a
message that names the field and the fix; and the few places that keep plain TRL's own
behaviour say so."""

from __future__ import annotations

import math

import pytest
from datasets import Dataset
from mlflow import MlflowClient

from trl_rapidfire import (
    Budget,
    List,
    PopulationBased,
    RFConfigError,
    RFGRPOConfig,
    RFGRPOTrainer,
    RFSFTConfig,
    RFSFTTrainer,
    SuccessiveHalving,
)
from trl_rapidfire.client.cli import main as cli_main
from trl_rapidfire.config.knobs import KnobError, knob_from_json
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_grpo_dataset,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BASE = {k: v for k, v in cpu_training_kwargs().items() if k != "report_to"}
BASE.update(per_device_train_batch_size=4, logging_steps=1, report_to="none")


def _trainer(out, *, data=None, policy=None, model=None, **kw):
    return RFSFTTrainer(
        model=model or tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         max_steps=2, **BASE, **kw),
        train_dataset=data if data is not None else make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4), policy=policy,
    )


@pytest.mark.parametrize("names, match", [
    (["no_such_field"], "'no_such_field', which is neither a field of RFSFTConfig nor an "
                        "argument of the trainer"),
    (["learnin_rate"], "Did you mean 'learning_rate'"),
    (["peft_config.no_such"], "LoraConfig has no field 'no_such'"),
    (["learning_rate.x"], "holds no config object"),
])
def test_clone_overrides_must_name_fields_or_trainer_arguments(tmp_path, names, match):
    with pytest.raises(RFConfigError, match=match):
        _trainer(tmp_path / "exp", clone_overrides=names)


def test_clone_overrides_that_exist_are_accepted(tmp_path):
    rf = _trainer(tmp_path / "exp", clone_overrides=["dataset_text_field", "model",
                                                     "peft_config.layers_pattern"])
    assert len(rf.engine.slots) == 2


@pytest.mark.parametrize("make", [
    lambda: Budget(max_wall_seconds=math.nan),
    lambda: Budget(max_wall_seconds=math.inf),
    lambda: Budget(max_total_steps=True),
    lambda: SuccessiveHalving(""),
    lambda: SuccessiveHalving("  "),
    lambda: SuccessiveHalving(None),
    lambda: PopulationBased("", mutations={"learning_rate": 2.0}),
])
def test_bad_policy_arguments_are_refused_when_made(make):
    with pytest.raises(ValueError, match="must"):
        make()


def test_a_policy_on_an_eval_metric_without_evaluation_is_refused(tmp_path):
    with pytest.raises(RFConfigError, match="the policy SuccessiveHalving reads 'eval_loss', "
                                            "which only evaluation logs"):
        _trainer(tmp_path / "exp", policy=SuccessiveHalving("eval_loss"))
    with pytest.raises(RFConfigError, match="SuccessiveHalving reads 'eval_loss'"):
        _trainer(tmp_path / "exp", policy=[Budget(max_total_steps=8), SuccessiveHalving()])
    # A metric training logs needs no evaluation.
    assert _trainer(tmp_path / "exp", policy=SuccessiveHalving("loss")).engine.policy


@pytest.mark.parametrize("values, match", [
    (["a b c", None, "d e"], "column 'text' is empty \\(None\\) in 1 row\\(s\\), the first at "
                             "row 1"),
    ([1, 2, 3], "column 'text' holds int64 values, not text"),
])
def test_a_text_column_with_none_or_numbers_is_refused_before_training(tmp_path, values, match):
    data = Dataset.from_dict({"text": values})
    with pytest.raises(RFConfigError, match=match):
        _trainer(tmp_path / "exp", data=data)


def test_a_filtered_text_column_is_read_as_it_is_shown(tmp_path):
    data = make_sft_dataset(20).add_column("keep", [i % 2 for i in range(20)])
    rows = [r["text"] if r["keep"] else None for r in data]
    data = Dataset.from_dict({"text": rows}).filter(lambda r: r["text"] is not None)
    assert len(_trainer(tmp_path / "exp", data=data).engine.slots) == 2


def test_a_model_candidate_that_does_not_exist_is_refused_before_any_run_loads(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(RFConfigError, match=r"`model` candidate 1 \('.*no-such-model'\) "
                                            "cannot be found"):
        _trainer(tmp_path / "exp", model=List([tiny_model_path(), missing]))


def test_a_yaml_range_error_says_how_yaml_writes_one():
    with pytest.raises(KnobError, match="Range needs low < high.*In YAML: learning_rate: "
                                        "{Range: {low: "):
        knob_from_json({"Range": {"low": 1e-3, "high": 1e-5}}, "learning_rate")
    with pytest.raises(KnobError, match="In YAML: learning_rate: {Range:"):
        knob_from_json({"Range": [1e-3, 1e-5]}, "learning_rate")


def test_a_single_grpo_run_whose_reward_raises_says_which_run(tmp_path):
    def broken(completions, **kwargs):
        return [1 / 0 for _ in completions]

    rf = RFGRPOTrainer(
        model=tiny_model_path(), reward_funcs=[broken], train_dataset=make_grpo_dataset(8),
        peft_config=tiny_lora_config(r=4),
        args=RFGRPOConfig(output_dir=str(tmp_path / "exp"), num_chunks=2, max_steps=2,
                          **dict(BASE, num_generations=4, max_completion_length=4)))
    # As plain GRPOTrainer raises it (its type and traceback), with the run named.
    with pytest.raises(ZeroDivisionError) as caught:
        rf.train()
    assert any("the experiment's one run, run-0" in n for n in caught.value.__notes__)


def test_a_damaged_optuna_journal_is_an_error_naming_the_file(tmp_path):
    pytest.importorskip("optuna")
    from trl_rapidfire import Range
    from trl_rapidfire.integrations.optuna.search import OptunaSearch
    from trl_rapidfire.shared_state.store import StoreError

    def build():
        return RFSFTTrainer(
            model=tiny_model_path(),
            args=RFSFTConfig(output_dir=str(tmp_path / "exp"), num_chunks=2, max_steps=2,
                             learning_rate=Range(1e-4, 1e-2, log=True), **BASE),
            train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4),
            search=OptunaSearch(num_runs=2, max_concurrent=1, metric="loss"))

    build().train()
    journal = tmp_path / "exp" / ".rapidfire" / "optuna.journal"
    good = journal.read_bytes()
    for bad in (b"this is not json\n", b"[" * 1500 + b"]" * 1500 + b"\n"):
        journal.write_bytes(good + bad + good.splitlines(keepends=True)[-1])
        with pytest.raises(StoreError, match="optuna.journal has a damaged line"):
            build()
    journal.write_bytes(good)
    build().train()  # restored: it continues


def test_the_cli_warns_when_it_replaces_an_op_not_yet_applied(tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), num_chunks=2, max_steps=2,
                         learning_rate=List([1e-3, 3e-3]), **dict(BASE, report_to="mlflow")),
        train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4))
    # The runs are registered in MLflow on the tracking thread, once built: a person at the
    # CLI a moment later finds them (here at once, so the test waits for them).
    rf.engine.tracker.flush()
    assert cli_main(["stop", "run-1", "--uri", uri, "--next-run"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert cli_main(["delete", "run-1", "--uri", uri, "--next-run"]) == 0
    err = capsys.readouterr().err
    assert "warning: run-1 had the op 'stop' waiting, not applied yet; 'delete' replaced it" \
        in err
    tags = MlflowClient(uri).get_run(rf.engine.tracker.run_id("run-1")).data.tags
    assert tags["rapidfire.op"] == "delete"
