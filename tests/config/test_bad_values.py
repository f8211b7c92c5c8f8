"""Issue 16: a bad value fails before anything trains, with a message naming the run (where
there is one), the field, the value and the fix."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import yaml
from datasets import Dataset
from trl import DPOConfig, GRPOConfig, SFTConfig, TrlParser

from trl_rapidfire import (
    GridSearch,
    KnobError,
    List,
    RandomSearch,
    Range,
    RFConfigError,
    RFDPOTrainer,
    RFGRPOConfig,
    RFGRPOTrainer,
    RFSFTConfig,
    RFSFTTrainer,
    SearchError,
)
from trl_rapidfire.config.dataset_checks import (
    check_dpo_dataset,
    check_grpo_dataset,
    check_sft_dataset,
)
from trl_rapidfire.config.preflight import PreflightError, check_run
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_dpo_dataset,
    make_grpo_dataset,
    make_sft_dataset,
    reward_short,
    tiny_lora_config,
    tiny_model_path,
)

# A model path that does not exist: a check that fails with this model proves it ran before
# any model was loaded.
NO_MODEL = "/nonexistent/model/never-loaded"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def cpu(tmp_path):
    return dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")


# --------------------------------------------------------------------------------------------
# Numeric fields: types and ranges
# --------------------------------------------------------------------------------------------

BAD = [
    # field, value, words the message must contain (besides the field and the value)
    ("learning_rate", -1e-3, ">= 0"),
    ("learning_rate", float("nan"), "NaN"),
    ("learning_rate", "abc", "is a str, but learning_rate takes a number"),
    ("learning_rate", float("inf"), "finite"),
    ("per_device_train_batch_size", 0, "integer >= 1"),
    ("per_device_train_batch_size", 2.5, "takes an integer"),
    ("per_device_eval_batch_size", 0, "integer >= 1"),
    ("gradient_accumulation_steps", 0, "integer >= 1"),
    ("seed", 2.5, "takes an integer"),
    ("seed", -1, "2**32"),
    ("num_train_epochs", -1, ">= 0"),
    ("max_steps", 2.5, "takes an integer"),
    ("weight_decay", float("nan"), "NaN"),
    ("max_grad_norm", float("nan"), "NaN"),
    ("adam_beta1", 1.0, "[0, 1)"),
    ("adam_beta2", -0.1, "[0, 1)"),
    ("adam_epsilon", float("inf"), "finite"),
    ("packing", 1, "is an int, but packing takes True or False"),
    ("max_length", "x", "takes an integer, or None"),
]


def _ids(case):
    return f"{case[0]}={case[1]!r}"


@pytest.mark.parametrize(("name", "value", "words"), BAD, ids=[_ids(c) for c in BAD])
def test_a_bad_value_fails_when_the_config_is_built(cpu, name, value, words):
    with pytest.raises(RFConfigError) as err:
        RFSFTConfig(**cpu, **{name: value})
    text = str(err.value)
    assert f"`{name}`={value!r}" in text and words in text
    assert f"Give {name}=" in text or f"Give e.g. {name}=" in text  # the fix


@pytest.mark.parametrize(("name", "value", "words"), BAD, ids=[_ids(c) for c in BAD])
def test_a_bad_list_candidate_fails_at_expansion_naming_its_run(cpu, name, value, words):
    good = SFTConfig.__dataclass_fields__[name].default
    if good is None:
        good = 8
    config = RFSFTConfig(**cpu, **{name: List([good, value])})  # the first candidate is good
    with pytest.raises(SearchError) as err:
        GridSearch().expand(config)
    text = str(err.value)
    assert text.startswith(f"run-1 ({name}=") and f"`{name}`={value!r}" in text and words in text


def test_values_training_accepts_pass(cpu):
    config = RFSFTConfig(
        **cpu, learning_rate=0, max_steps=-1, seed=0, data_seed=None, warmup_steps=0.1,
        max_grad_norm=float("inf"),  # measures the gradient norm without clipping
        per_device_train_batch_size=List([np.int64(2), 4]), num_train_epochs=1,
        max_length=None,
    )
    assert len(GridSearch().expand(config)) == 2


@pytest.mark.parametrize(
    ("config_class", "extra"),
    [(SFTConfig, {}), (DPOConfig, {}), (GRPOConfig, {"per_device_train_batch_size": 8})],
)
def test_trl_defaults_pass_every_check(tmp_path, config_class, extra):
    check_run(config_class(output_dir=str(tmp_path), use_cpu=True, bf16=False, **extra), {})
    check_run(config_class(output_dir=str(tmp_path), **cpu_training_kwargs(), **extra), {})


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [("temperature", 0.0, "> 0"), ("top_p", 1.5, "(0, 1]"), ("num_iterations", 0, ">= 1"),
     ("reward_weights", [1.0, "x"], "list of numbers")],
)
def test_grpo_fields(cpu, name, value, words):
    grpo = dict(cpu, per_device_train_batch_size=4, num_generations=2)
    with pytest.raises(SearchError, match=rf"run-1.*`{name}`.*{re.escape(words)}") as err:
        good = [1.0] if name == "reward_weights" else 1
        GridSearch().expand(RFGRPOConfig(**grpo, **{name: List([good, value])}))
    assert "Give" in str(err.value)


def test_a_yaml_exponent_read_as_text_is_explained(cpu):
    # PyYAML reads 1e-3 (no dot) as a string; inside a List nothing converts it.
    config = yaml.safe_load("learning_rate: {List: [3.0e-4, 1e-3]}")
    with pytest.raises(SearchError, match=r"run-1.*'1e-3' is text.*write 1\.0e-3"):
        GridSearch().expand(RFSFTConfig(**cpu, **config))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [({"learning_rate": float("nan")}, "NaN"), ({"learning_rate": -1.0}, ">= 0"),
     ({"per_device_train_batch_size": 0}, ">= 1"), ({"seed": 2.5}, "takes an integer")],
)
def test_check_run_refuses_what_a_clone_could_ask_for(tmp_path, overrides, words):
    # A clone's config is built by concrete_config/dataclasses.replace, then check_run: plain
    # TRL builds all of these without a word.
    config = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **overrides)
    with pytest.raises(PreflightError, match=rf"`{next(iter(overrides))}`.*{words}"):
        check_run(config, {})


@pytest.mark.parametrize(
    ("name", "bad", "words"),
    [("peft_config", "abc", "takes a PEFT config"),
     ("peft_config", {"r": 8}, "is a dict, but peft_config takes a PEFT config"),
     ("formatting_func", "text", "takes a function"),
     ("model", 3, "model name or path")],
)
def test_a_bad_trainer_level_candidate_fails_at_expansion(cpu, name, bad, words):
    good = {"peft_config": tiny_lora_config(), "formatting_func": lambda ex: ex["text"],
            "model": "tiny"}[name]
    with pytest.raises(SearchError, match=rf"^run-1 .*`{name}`=.*{words}"):
        GridSearch().expand(RFSFTConfig(**cpu), **{name: List([good, bad])})


def test_a_bad_reward_function_fails_at_expansion(cpu):
    grpo = RFGRPOConfig(**cpu, per_device_train_batch_size=4, num_generations=2)
    with pytest.raises(SearchError, match=r"run-1 .*`reward_funcs`=3 is an int"):
        GridSearch().expand(grpo, reward_funcs=List([[reward_short], [reward_short, 3]]))


def test_a_range_on_a_trainer_argument_is_an_error(cpu):
    with pytest.raises(SearchError, match=r"`peft_config`=Range.*List\(\[\.\.\.\]\)"):
        RandomSearch(2).expand(RFSFTConfig(**cpu), peft_config=Range(4, 16))


# --------------------------------------------------------------------------------------------
# Range on integer fields
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["per_device_train_batch_size", "gradient_accumulation_steps",
                                  "max_steps", "max_length"])
def test_a_range_on_an_integer_field_draws_integers(cpu, name):
    config = RFSFTConfig(**cpu, **{name: Range(2, 8)})
    assert config.knobs[name] == Range(2, 8, dtype=int)
    assert config.to_dict()[name] == {"Range": {"low": 2, "high": 8, "dtype": "int"}}
    values = [getattr(r.config, name) for r in RandomSearch(12, seed=1).expand(config)]
    assert all(type(v) is int and 2 <= v <= 8 for v in values) and len(set(values)) > 2


def test_a_range_on_a_float_field_still_draws_floats(cpu):
    config = RFSFTConfig(**cpu, weight_decay=Range(0, 1))
    values = [r.config.weight_decay for r in RandomSearch(4, seed=0).expand(config)]
    assert all(isinstance(v, float) and not float(v).is_integer() for v in values)


def test_a_log_range_on_an_integer_field_draws_integers(cpu):
    config = RFSFTConfig(**cpu, gradient_accumulation_steps=Range(1, 16, log=True))
    values = [r.config.gradient_accumulation_steps for r in RandomSearch(8).expand(config)]
    assert all(type(v) is int and 1 <= v <= 16 for v in values)


@pytest.mark.parametrize(
    "value",
    [Range(2, 8, dtype=float), {"Range": {"low": 2, "high": 8, "dtype": "float"}}],
    ids=["python", "yaml"],
)
def test_an_explicit_float_range_on_an_integer_field_is_an_error(cpu, value):
    with pytest.raises(KnobError, match=r"`per_device_train_batch_size` takes an integer.*"
                                            r"draws floats.*Range\(2, 8, dtype=int\).*dtype: int"):
        RFSFTConfig(**cpu, per_device_train_batch_size=value)


def test_a_fractional_range_on_an_integer_field_is_an_error(cpu):
    with pytest.raises(KnobError, match=r"`seed`.*whole-number bounds.*Range\(1, 8, dtype"):
        RFSFTConfig(**cpu, seed=Range(1.5, 8))


# --------------------------------------------------------------------------------------------
# YAML knob keys
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["Lst", "list", "LIST", "Lists", "range", "Rnage"])
def test_a_near_miss_knob_key_names_the_field_and_the_yaml_form(cpu, key):
    spec = {"low": 1e-5, "high": 1e-3} if key.lower().startswith("r") else [1e-4, 3e-4]
    with pytest.raises(KnobError) as err:
        RFSFTConfig(**cpu, learning_rate={key: spec})
    text = str(err.value)
    assert text.startswith(f"`learning_rate`: the key {key!r} is not a knob")
    if isinstance(spec, list):
        assert "learning_rate: {List: [0.0001, 0.0003]}" in text
    else:
        assert "learning_rate: {Range: {low:" in text


def test_a_near_miss_key_on_a_field_that_takes_a_dict_is_flagged(cpu):
    with pytest.raises(KnobError, match=r"`lr_scheduler_kwargs`: the key 'list' is not a knob"):
        RFSFTConfig(**cpu, lr_scheduler_kwargs={"list": [{"num_cycles": 1}, {"num_cycles": 2}]})


def test_a_plain_dict_on_a_field_that_takes_a_dict_is_a_value(cpu):
    config = RFSFTConfig(**cpu, lr_scheduler_kwargs={"last_epoch": -1},
                         model_init_kwargs={"dtype": "float32"})
    assert config.knobs == {}
    assert config.lr_scheduler_kwargs == {"last_epoch": -1}


def test_a_list_key_on_a_field_that_takes_a_dict_is_a_knob(cpu):
    config = RFSFTConfig(**cpu, lr_scheduler_type="cosine_with_min_lr",
                         lr_scheduler_kwargs={"List": [{"min_lr": 1e-6}, {"min_lr_rate": 0.1}]})
    runs = GridSearch().expand(config)
    assert [r.config.lr_scheduler_kwargs for r in runs] == [{"min_lr": 1e-6}, {"min_lr_rate": 0.1}]


def test_a_knob_key_with_other_keys_is_an_error(cpu):
    with pytest.raises(KnobError, match=r"`learning_rate`: a List knob must be the only key.*"
                                        r"'extra'.*learning_rate: {List: \[0.0001\]}"):
        RFSFTConfig(**cpu, learning_rate={"List": [1e-4], "extra": 1})


def test_a_dict_on_a_numeric_field_points_to_the_list_form(cpu):
    with pytest.raises(RFConfigError, match=r"`learning_rate`=\{'lr': 0.1\} is a dict.*"
                                            r"\{List: \[\.\.\.\]\} in YAML"):
        RFSFTConfig(**cpu, learning_rate={"lr": 0.1})


def test_mixed_types_in_a_yaml_list_fail_at_expansion(cpu):
    config = RFSFTConfig(**cpu, **yaml.safe_load("learning_rate: {List: [1.0e-3, cosine]}"))
    with pytest.raises(SearchError, match=r"run-1 \(learning_rate='cosine'\).*takes a number"):
        GridSearch().expand(config)


def test_the_plain_list_error_gives_the_yaml_form_too(cpu):
    with pytest.raises(RFConfigError, match=r"learning_rate=List\(\[0.0001, 0.0003\]\) in Python"
                                            r", or learning_rate: {List: \[0.0001, 0.0003\]} in"):
        RFSFTConfig(**cpu, learning_rate=[1e-4, 3e-4])


def test_a_near_miss_key_in_a_yaml_file_fails_the_parse(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\nbf16: false\n"
                    "learning_rate: {Lst: [1.0e-4, 3.0e-4]}\n")
    with pytest.raises(KnobError, match="learning_rate: {List: "):
        TrlParser(dataclass_types=[RFSFTConfig]).parse_args_and_config(["--config", str(path)])


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dataset", "config", "func"),
    [
        (make_sft_dataset(4), {}, None),
        (make_sft_dataset(4, kind="messages"), {}, None),
        (make_sft_dataset(4, kind="prompt_completion"), {}, None),
        (Dataset.from_dict({"body": ["a"]}), {"dataset_text_field": "body"}, None),
        (Dataset.from_dict({"q": ["a"]}), {}, lambda ex: ex["q"]),
        (Dataset.from_dict({"conversations": [[{"from": "human", "value": "hi"}]]}), {}, None),
        (Dataset.from_dict({"input_ids": [[1, 2]]}), {}, None),
        (Dataset.from_dict({"q": ["a"]}), {"dataset_kwargs": {"skip_prepare_dataset": True}},
         None),
    ],
    ids=["text", "messages", "prompt-completion", "text-field", "formatting-func",
         "sharegpt", "tokenized", "skip-prepare"],
)
def test_every_form_sft_reads_passes(cpu, dataset, config, func):
    check_sft_dataset(dataset, SFTConfig(**cpu, **config), formatting_func=func)


@pytest.mark.parametrize(
    ("dataset", "config", "func", "words"),
    [
        (Dataset.from_dict({"content": ["a"]}), {}, None,
         r"no column 'text' \(`dataset_text_field`\); its columns are \['content'\].*"
         r"Set dataset_text_field='content'"),
        (make_sft_dataset(4), {"dataset_text_field": "body"}, None,
         r"no column 'body'.*rename_column\('text', 'body'\)"),
        (Dataset.from_dict({"q": ["a"]}), {"dataset_text_field": "body"}, lambda ex: ex["q"],
         "formatting_func writes 'text'"),
        (Dataset.from_dict({"prompt": ["a"]}), {}, None, "'prompt' column but no 'completion'"),
        (make_sft_dataset(4).select([]), {}, None, r"train_dataset is empty \(0 rows\)"),
    ],
    ids=["no-text", "wrong-text-field", "formatting-func-wrong-field", "prompt-only", "empty"],
)
def test_what_sft_cannot_read_is_named(cpu, dataset, config, func, words):
    with pytest.raises(PreflightError, match=words):
        check_sft_dataset(dataset, SFTConfig(**cpu, **config), formatting_func=func)


def test_an_empty_eval_dataset_in_a_dict_is_named(cpu):
    evals = {"a": make_sft_dataset(2), "b": make_sft_dataset(2).select([])}
    with pytest.raises(PreflightError, match=r"eval_dataset\['b'\] is empty"):
        check_sft_dataset(evals, SFTConfig(**cpu), label="eval_dataset")


def test_dpo_and_grpo_columns():
    check_dpo_dataset(make_dpo_dataset(2))
    check_dpo_dataset(make_dpo_dataset(2).remove_columns("prompt"))  # implicit prompt
    with pytest.raises(PreflightError, match=r"no 'rejected' column.*\['prompt', 'chosen'\]"):
        check_dpo_dataset(make_dpo_dataset(2).remove_columns("rejected"))
    check_grpo_dataset(make_grpo_dataset(2))
    with pytest.raises(PreflightError, match=r"no 'prompt' column.*rename_column\('question'"):
        check_grpo_dataset(make_grpo_dataset(2).rename_column("prompt", "question"))
    with pytest.raises(PreflightError, match="eval_dataset is empty"):
        check_grpo_dataset(make_grpo_dataset(2).select([]), label="eval_dataset")


def test_trainers_refuse_unreadable_datasets_before_loading_a_model(cpu):
    with pytest.raises(RFConfigError, match="train_dataset is empty"):
        RFSFTTrainer(model=NO_MODEL, args=RFSFTConfig(**cpu),
                     train_dataset=make_sft_dataset(2).select([]))
    with pytest.raises(RFConfigError, match="eval_dataset is empty"):
        RFSFTTrainer(model=NO_MODEL, args=RFSFTConfig(**cpu), train_dataset=make_sft_dataset(2),
                     eval_dataset=make_sft_dataset(2).select([]))
    with pytest.raises(RFConfigError, match="no 'chosen' or 'rejected' column"):
        RFDPOTrainer(model=NO_MODEL, args=None, train_dataset=make_sft_dataset(2))
    with pytest.raises(RFConfigError, match="no 'prompt' column"):
        RFGRPOTrainer(model=NO_MODEL, reward_funcs=reward_short, train_dataset=make_sft_dataset(2),
                      args=RFGRPOConfig(**cpu, per_device_train_batch_size=4, num_generations=2))


def test_every_kind_refuses_rows_it_cannot_read_and_takes_every_form_its_trl_trainer_reads():
    from trl_rapidfire import RFKTOTrainer, RFRewardTrainer, RFRLOOTrainer
    from trl_rapidfire.config.dataset_checks import check_dpo_dataset, check_kto_dataset
    from trl_rapidfire.config.preflight import PreflightError
    from trl_rapidfire.testing import make_dpo_dataset, make_kto_dataset

    text = make_sft_dataset(2)
    with pytest.raises(RFConfigError, match="no 'completion' or 'label' column.*KTO reads"):
        RFKTOTrainer(model=NO_MODEL, train_dataset=text)
    with pytest.raises(RFConfigError, match="no 'chosen' or 'rejected' column.*Reward reads"):
        RFRewardTrainer(model=NO_MODEL, train_dataset=text)
    with pytest.raises(RFConfigError, match="no 'prompt' column.*RLOO generates"):
        RFRLOOTrainer(model=NO_MODEL, reward_funcs=reward_short, train_dataset=text)
    # What TRL reads besides: KTO unpairs preference pairs; tokenized rows of either kind.
    pairs = make_dpo_dataset(2)
    check_kto_dataset(pairs)
    check_kto_dataset(make_kto_dataset(2))
    check_kto_dataset(Dataset.from_dict({"prompt_ids": [[1]], "completion_ids": [[2]],
                                         "label": [True]}))
    for names in (("chosen_ids", "rejected_ids"), ("chosen_input_ids", "rejected_input_ids")):
        check_dpo_dataset(Dataset.from_dict({n: [[1, 2]] for n in names}), kind="Reward")
    with pytest.raises(PreflightError, match=r"rename_column\('response', 'completion'\)"):
        check_kto_dataset(Dataset.from_dict({"prompt": ["q"], "response": ["a"]}))


def test_a_text_field_knob_naming_a_missing_column_fails_setup_naming_the_run(cpu):
    args = RFSFTConfig(**{**cpu, **cpu_training_kwargs()}, max_steps=2,
                       dataset_text_field=List(["text", "content"]))
    with pytest.raises(RFConfigError, match=r"^run-1: train_dataset has no column 'content'"):
        RFSFTTrainer(model=tiny_model_path(), args=args, train_dataset=make_sft_dataset(4),
                     peft_config=tiny_lora_config(r=2))


def test_a_bad_candidate_fails_setup_before_any_run_trains(cpu, tmp_path):
    args = RFSFTConfig(**cpu, learning_rate=List([1e-3, "abc"]), max_steps=2)
    with pytest.raises(SearchError, match=r"run-1 \(learning_rate='abc'\)"):
        RFSFTTrainer(model=NO_MODEL, args=args, train_dataset=make_sft_dataset(4))
    assert not (tmp_path / "runs").exists()


def test_a_clone_with_a_nan_learning_rate_is_refused_and_the_run_trains_on(tmp_path):
    args = RFSFTConfig(output_dir=str(tmp_path), **cpu_training_kwargs(), max_steps=2,
                       num_chunks=2, per_device_train_batch_size=2, learning_rate=1e-3)
    trainer = RFSFTTrainer(model=tiny_model_path(), args=args, train_dataset=make_sft_dataset(4),
                           peft_config=tiny_lora_config(r=2))
    trainer.clone("run-0", {"learning_rate": float("nan")})
    trainer.clone("run-0", {"learning_rate": -1.0})
    trainer.train()
    assert [(r.name, r.status) for r in trainer.runs] == [("run-0", RunStatus.COMPLETED)]
    results = [record.result for record in trainer.op_log]
    assert len(results) == 2 and all(r.startswith("error") for r in results)
    assert "`learning_rate`=nan is not a number" in results[0]
    assert "`learning_rate`=-1.0 is out of range" in results[1]
    assert math.isfinite(trainer.run_trainer("run-0").state.log_history[-1]["train_loss"])


def test_a_dataset_dict_as_train_dataset_asks_for_one_split(cpu):
    from datasets import DatasetDict

    splits = DatasetDict({"train": make_sft_dataset(2), "test": make_sft_dataset(2)})
    with pytest.raises(RFConfigError, match=r"DatasetDict of splits \['train', 'test'\].*"
                                            r"train_dataset=dataset\['train'\]"):
        RFSFTTrainer(model=NO_MODEL, args=RFSFTConfig(**cpu), train_dataset=splits)


@pytest.mark.parametrize(
    ("name", "good", "bad", "words"),
    [
        ("lr_scheduler_kwargs", {}, {"bogus": 1},
         r"`lr_scheduler_kwargs` sets \['bogus'\], which the 'linear' schedule does not take; "
         r"it takes \['last_epoch'\]"),
        ("packing_strategy", "bfd", "bogus", r"TRL accepts \['bfd', 'bfd_split', 'wrapped'\]"),
        ("truncation_mode", "keep_start", "bogus", r"TRL accepts \['keep_end', 'keep_start'\]"),
        ("report_to", "none", "bogus", r"'bogus' is not a reporting integration.*'mlflow'"),
    ],
)
def test_candidates_that_failed_only_in_their_own_run_now_fail_expansion(cpu, name, good, bad,
                                                                         words):
    # Each of these used to let run-0 train and then fail run-1 (trainer build or first step).
    config = RFSFTConfig(**{**cpu, name: List([good, bad])})
    with pytest.raises(SearchError, match=rf"^run-1 \({name}=.*{words}"):
        GridSearch().expand(config)


def test_scheduler_kwargs_of_the_chosen_schedule_pass(cpu):
    config = RFSFTConfig(**cpu, lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 1})
    assert GridSearch().expand(config)[0].config.lr_scheduler_kwargs == {"num_cycles": 1}
