"""Tests for ``trl_rapidfire.search.searches``: how knobs expand into runs, and pre-flight
checks."""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import pytest
from peft import LoraConfig
from trl import DPOConfig, GRPOConfig, SFTConfig

from trl_rapidfire import (
    GridSearch,
    List,
    RandomSearch,
    Range,
    RFDPOConfig,
    RFGRPOConfig,
    RFSFTConfig,
    RunSpec,
    SearchError,
)
from trl_rapidfire.config.preflight import allowed_values


@pytest.fixture
def cpu(tmp_path):
    return dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")


@pytest.fixture
def grpo_cpu(cpu):
    # Generation batch (4) must be divisible by num_generations, or GRPOConfig raises.
    return dict(cpu, per_device_train_batch_size=4, num_generations=2)


def reward_len(completions, **kwargs):
    return [float(len(c)) for c in completions]


def reward_short(completions, **kwargs):
    return [-float(len(c)) for c in completions]


def reward_format(completions, **kwargs):
    return [1.0 for _ in completions]


def format_plain(example):
    return example["text"]


def format_chat(example):
    return "User: " + example["text"]


LORA_SMALL = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])
LORA_BIG = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"])


def field_position(cls, name):
    return [f.name for f in dataclasses.fields(cls)].index(name)


def knob_values(runs):
    return [tuple(run.knobs.values()) for run in runs]


# --------------------------------------------------------------------------------------------
# GridSearch
# --------------------------------------------------------------------------------------------


def test_grid_is_the_cartesian_product_in_documented_order(cpu):
    # Written in reverse field order: the axes still follow the dataclass field order.
    assert field_position(RFSFTConfig, "learning_rate") < field_position(
        RFSFTConfig, "weight_decay"
    )
    config = RFSFTConfig(**cpu, weight_decay=List([0.0, 0.1]), learning_rate=List([1e-4, 1e-3]))
    runs = GridSearch().expand(
        config,
        model=List(["model-a", "model-b"]),
        formatting_func=List([format_plain, format_chat]),
    )

    expected = list(
        itertools.product(
            [1e-4, 1e-3], [0.0, 0.1], ["model-a", "model-b"], [format_plain, format_chat]
        )
    )
    assert len(runs) == 16
    assert knob_values(runs) == expected
    for i, run in enumerate(runs):
        assert isinstance(run, RunSpec)
        assert run.name == f"run-{i}"
        assert run.index == i
        assert list(run.knobs) == ["learning_rate", "weight_decay", "model", "formatting_func"]


def test_trainer_level_knobs_keep_kwarg_order(cpu):
    config = RFSFTConfig(**cpu)
    runs = GridSearch().expand(
        config,
        formatting_func=List([format_plain, format_chat]),
        model=List(["model-a", "model-b", "model-c"]),
    )
    assert knob_values(runs) == list(
        itertools.product([format_plain, format_chat], ["model-a", "model-b", "model-c"])
    )
    assert list(runs[0].knobs) == ["formatting_func", "model"]


def test_grid_run_configs_are_trl_configs_with_chosen_values(cpu):
    config = RFSFTConfig(
        **cpu,
        learning_rate=List([2e-4, 1e-5]),
        lr_scheduler_type=List(["linear", "cosine"]),
        num_train_epochs=2,
        max_length=64,
    )
    runs = GridSearch().expand(config)
    assert len(runs) == 4
    seen = set()
    for run in runs:
        assert type(run.config) is SFTConfig
        assert set(run.knobs) == {"learning_rate", "lr_scheduler_type"}
        assert run.config.learning_rate == run.knobs["learning_rate"]
        assert run.config.lr_scheduler_type == run.knobs["lr_scheduler_type"]
        # Fixed values reach every run unchanged.
        assert run.config.num_train_epochs == 2
        assert run.config.max_length == 64
        assert run.config.use_cpu is True
        assert run.trainer_kwargs == {}
        seen.add((run.config.learning_rate, str(run.config.lr_scheduler_type.value)))
    assert seen == {(2e-4, "linear"), (2e-4, "cosine"), (1e-5, "linear"), (1e-5, "cosine")}
    # Each run has its own config object.
    assert len({id(run.config) for run in runs}) == 4
    # The RF config still reads back what the user wrote.
    assert config.learning_rate == List([2e-4, 1e-5])


def test_dpo_and_grpo_runs_are_their_trl_parent_class(cpu, grpo_cpu):
    dpo_runs = GridSearch().expand(RFDPOConfig(**cpu, beta=List([0.1, 0.5])))
    assert [type(run.config) for run in dpo_runs] == [DPOConfig, DPOConfig]
    assert [run.config.beta for run in dpo_runs] == [0.1, 0.5]

    grpo_runs = GridSearch().expand(RFGRPOConfig(**grpo_cpu, beta=List([0.0, 0.04])))
    assert [type(run.config) for run in grpo_runs] == [GRPOConfig, GRPOConfig]
    assert [run.config.beta for run in grpo_runs] == [0.0, 0.04]


def test_trainer_level_knobs_and_plain_values(cpu):
    tokenizer = object()
    dataset = [{"text": "hello"}]
    config = RFSFTConfig(**cpu, learning_rate=List([1e-4, 1e-3]))
    runs = GridSearch().expand(
        config,
        model=List(["tiny-a", "tiny-b"]),
        peft_config=List([LORA_SMALL, LORA_BIG]),
        formatting_func=List([format_plain, format_chat]),
        processing_class=tokenizer,
        train_dataset=dataset,
    )
    assert len(runs) == 16
    for run in runs:
        kwargs = run.trainer_kwargs
        assert list(kwargs) == [
            "model",
            "peft_config",
            "formatting_func",
            "processing_class",
            "train_dataset",
        ]
        # Plain values pass through unchanged, the very same objects.
        assert kwargs["processing_class"] is tokenizer
        assert kwargs["train_dataset"] is dataset
        # Knobs are resolved to one candidate, the candidate object itself.
        assert kwargs["model"] == run.knobs["model"]
        assert kwargs["peft_config"] is run.knobs["peft_config"]
        assert kwargs["peft_config"] is LORA_SMALL or kwargs["peft_config"] is LORA_BIG
        assert kwargs["formatting_func"] is run.knobs["formatting_func"]
        # Only knobs are listed as knobs, by the names the user wrote.
        assert list(run.knobs) == ["learning_rate", "model", "peft_config", "formatting_func"]
        # Trainer-level knobs are not config fields.
        assert type(run.config) is SFTConfig
    loras = {
        (
            run.trainer_kwargs["peft_config"].r,
            tuple(sorted(run.trainer_kwargs["peft_config"].target_modules)),
        )
        for run in runs
    }
    assert loras == {(4, ("q_proj",)), (16, ("q_proj", "v_proj"))}
    assert {run.trainer_kwargs["model"] for run in runs} == {"tiny-a", "tiny-b"}


def test_no_knobs_gives_exactly_one_run(cpu):
    tokenizer = object()
    runs = GridSearch().expand(
        RFSFTConfig(**cpu, learning_rate=3e-4), model="tiny", processing_class=tokenizer
    )
    assert len(runs) == 1
    (run,) = runs
    assert run.name == "run-0" and run.index == 0
    assert run.knobs == {}
    assert run.describe() == "(single config)"
    assert type(run.config) is SFTConfig
    assert run.config.learning_rate == 3e-4
    assert run.trainer_kwargs == {"model": "tiny", "processing_class": tokenizer}
    assert run.trainer_kwargs["processing_class"] is tokenizer


def test_describe_lists_knob_values(cpu):
    runs = GridSearch().expand(
        RFSFTConfig(**cpu, learning_rate=List([2e-4])),
        peft_config=List([LORA_BIG]),
        formatting_func=List([format_chat]),
    )
    text = runs[0].describe()
    assert "learning_rate=0.0002" in text
    assert "LoraConfig(r=16" in text
    assert "formatting_func=format_chat" in text


def test_range_in_grid_search_is_an_error(cpu):
    config = RFSFTConfig(
        **cpu, learning_rate=Range(1e-5, 1e-3, log=True), weight_decay=List([0.0, 0.1])
    )
    with pytest.raises(SearchError, match="learning_rate") as err:
        GridSearch().expand(config)
    assert "RandomSearch" in str(err.value)


def test_same_name_as_config_knob_and_trainer_argument_is_an_error(cpu):
    config = RFSFTConfig(**cpu, learning_rate=List([1e-4, 1e-3]))
    with pytest.raises(SearchError, match="learning_rate"):
        GridSearch().expand(config, learning_rate=List([1e-2]))


# --------------------------------------------------------------------------------------------
# zip groups
# --------------------------------------------------------------------------------------------

FUNC_SETS = [[reward_len, reward_short], [reward_len, reward_format], [reward_len]]
WEIGHT_SETS = [[1.0, 0.0], [0.5, 0.5], [1.0]]
ZIP = [("reward_funcs", "reward_weights")]


def test_zip_pairs_lists_instead_of_crossing(grpo_cpu):
    funcs = List(FUNC_SETS)
    config = RFGRPOConfig(**grpo_cpu, reward_weights=List(WEIGHT_SETS))
    runs = GridSearch(zip=ZIP).expand(config, reward_funcs=funcs)

    assert len(runs) == 3
    assert [run.name for run in runs] == ["run-0", "run-1", "run-2"]
    for i, run in enumerate(runs):
        assert type(run.config) is GRPOConfig
        assert run.knobs["reward_weights"] == WEIGHT_SETS[i]
        assert run.knobs["reward_funcs"] is funcs[i]
        assert run.trainer_kwargs["reward_funcs"] is funcs[i]
        assert run.config.reward_weights == WEIGHT_SETS[i]
        assert len(run.config.reward_weights) == len(run.trainer_kwargs["reward_funcs"])
        # Knob names as written: config fields first, then trainer-level arguments.
        assert list(run.knobs) == ["reward_weights", "reward_funcs"]


def test_zip_group_crossed_with_other_knobs(grpo_cpu):
    config = RFGRPOConfig(
        **grpo_cpu, learning_rate=List([1e-5, 1e-6]), reward_weights=List(WEIGHT_SETS)
    )
    runs = GridSearch(zip=ZIP).expand(
        config, reward_funcs=List(FUNC_SETS), model=List(["tiny-a", "tiny-b"])
    )
    assert len(runs) == 2 * 3 * 2
    expected = [
        (lr, WEIGHT_SETS[i], FUNC_SETS[i], model)
        for lr in (1e-5, 1e-6)
        for i in range(3)
        for model in ("tiny-a", "tiny-b")
    ]
    assert knob_values(runs) == expected
    for run in runs:
        assert len(run.config.reward_weights) == len(run.trainer_kwargs["reward_funcs"])
        assert run.config.learning_rate == run.knobs["learning_rate"]


def test_zip_may_repeat_a_function_set_with_different_weights(grpo_cpu):
    config = RFGRPOConfig(**grpo_cpu, reward_weights=List(WEIGHT_SETS))
    funcs = List([[reward_len, reward_short], [reward_len, reward_short], [reward_len]])
    runs = GridSearch(zip=ZIP).expand(config, reward_funcs=funcs)
    assert len(runs) == 3
    assert [len(run.config.reward_weights) for run in runs] == [2, 2, 1]


def test_zipped_lists_of_different_lengths_are_an_error(grpo_cpu):
    config = RFGRPOConfig(**grpo_cpu, reward_weights=List(WEIGHT_SETS[:2]))
    with pytest.raises(SearchError, match="equal lengths") as err:
        GridSearch(zip=ZIP).expand(config, reward_funcs=List(FUNC_SETS))
    assert "reward_funcs" in str(err.value) and "reward_weights" in str(err.value)


def test_zip_naming_a_non_knob_is_an_error(grpo_cpu):
    config = RFGRPOConfig(**grpo_cpu, reward_weights=List(WEIGHT_SETS))
    # Not given at all.
    with pytest.raises(SearchError, match="`reward_funcs`.*not a knob"):
        GridSearch(zip=ZIP).expand(config)
    # Given as a plain value.
    with pytest.raises(SearchError, match="`reward_funcs`.*not a knob"):
        GridSearch(zip=ZIP).expand(config, reward_funcs=[reward_len])


def test_range_in_a_zip_is_an_error(cpu):
    config = RFSFTConfig(**cpu, learning_rate=Range(1e-5, 1e-3), weight_decay=List([0.0, 0.1]))
    for search in (
        GridSearch(zip=[("learning_rate", "weight_decay")]),
        RandomSearch(num_runs=3, zip=[("learning_rate", "weight_decay")]),
    ):
        with pytest.raises(SearchError, match="learning_rate") as err:
            search.expand(config)
        assert "List" in str(err.value)


def test_a_name_in_two_zip_groups_is_an_error():
    groups = [("reward_funcs", "reward_weights"), ("reward_funcs", "model")]
    with pytest.raises(SearchError, match="`reward_funcs`.*more than one zip group"):
        GridSearch(zip=groups)
    with pytest.raises(SearchError, match="more than one zip group"):
        RandomSearch(num_runs=2, zip=groups)


@pytest.mark.parametrize(
    "group",
    [("reward_funcs",), (), "reward_funcs", ["reward_weights"]],
    ids=["one-name", "empty", "bare-string", "one-name-list"],
)
def test_zip_group_needs_at_least_two_names(group):
    with pytest.raises(SearchError, match="at least two knob names"):
        GridSearch(zip=[group])
    with pytest.raises(SearchError, match="at least two knob names"):
        RandomSearch(num_runs=2, zip=[group])


def test_random_search_keeps_zipped_pairs_together(grpo_cpu):
    config = RFGRPOConfig(
        **grpo_cpu, learning_rate=Range(1e-6, 1e-4, log=True), reward_weights=List(WEIGHT_SETS)
    )
    runs = RandomSearch(num_runs=12, seed=1, zip=ZIP).expand(config, reward_funcs=List(FUNC_SETS))
    assert len(runs) == 12
    pairs_seen = set()
    for run in runs:
        i = WEIGHT_SETS.index(run.knobs["reward_weights"])
        assert run.trainer_kwargs["reward_funcs"] == FUNC_SETS[i]
        assert len(run.config.reward_weights) == len(run.trainer_kwargs["reward_funcs"])
        assert 1e-6 <= run.config.learning_rate < 1e-4
        pairs_seen.add(i)
    assert pairs_seen == {0, 1, 2}


# --------------------------------------------------------------------------------------------
# reward_weights vs reward_funcs
# --------------------------------------------------------------------------------------------


def test_reward_weights_mismatch_without_zip_names_run_and_fix(grpo_cpu):
    config = RFGRPOConfig(**grpo_cpu, reward_weights=[1.0])
    # run-0 has one function (fine); run-1 has two functions for one weight.
    with pytest.raises(SearchError) as err:
        GridSearch().expand(config, reward_funcs=List([[reward_len], [reward_len, reward_short]]))
    message = str(err.value)
    assert message.startswith("run-1")
    assert "reward_weights" in message
    assert "1 weight(s) for 2 reward function(s)" in message
    assert 'zip=[("reward_funcs", "reward_weights")]' in message


def test_reward_weights_mismatch_with_plain_values(grpo_cpu):
    config = RFGRPOConfig(**grpo_cpu, reward_weights=[1.0])
    with pytest.raises(SearchError, match=r"^run-0.*reward_weights"):
        GridSearch().expand(config, reward_funcs=[reward_len, reward_short])
    # Matching counts are fine.
    runs = GridSearch().expand(
        RFGRPOConfig(**grpo_cpu, reward_weights=[0.5, 0.5]),
        reward_funcs=[reward_len, reward_short],
    )
    assert len(runs) == 1


# --------------------------------------------------------------------------------------------
# RandomSearch
# --------------------------------------------------------------------------------------------


def _random_space(cpu):
    return RFSFTConfig(
        **cpu,
        learning_rate=Range(1e-5, 1e-3, log=True),
        weight_decay=List([0.0, 0.01, 0.1]),
        warmup_steps=Range(0, 10, dtype=int),
    )


def test_random_search_is_deterministic_given_seed(cpu):
    config = _random_space(cpu)
    model = List(["tiny-a", "tiny-b"])
    first = RandomSearch(num_runs=6, seed=3).expand(config, model=model)
    again = RandomSearch(num_runs=6, seed=3).expand(config, model=model)
    other = RandomSearch(num_runs=6, seed=4).expand(config, model=model)
    assert [run.knobs for run in first] == [run.knobs for run in again]
    assert [run.knobs for run in first] != [run.knobs for run in other]
    default = RandomSearch(num_runs=6).expand(config, model=model)
    assert [run.knobs for run in default] == [
        run.knobs for run in RandomSearch(num_runs=6, seed=0).expand(config, model=model)
    ]


def test_random_search_draws_num_runs_from_a_large_space(cpu):
    runs = RandomSearch(num_runs=8, seed=0).expand(_random_space(cpu), model=List(["a", "b"]))
    assert len(runs) == 8
    assert [run.name for run in runs] == [f"run-{i}" for i in range(8)]
    assert [run.index for run in runs] == list(range(8))
    config_fields = sorted(
        ["learning_rate", "weight_decay", "warmup_steps"],
        key=lambda name: field_position(RFSFTConfig, name),
    )
    for run in runs:
        assert list(run.knobs) == [*config_fields, "model"]
        lr = run.knobs["learning_rate"]
        assert isinstance(lr, float) and 1e-5 <= lr < 1e-3
        assert run.config.learning_rate == lr
        assert run.knobs["weight_decay"] in (0.0, 0.01, 0.1)
        assert run.config.weight_decay == run.knobs["weight_decay"]
        steps = run.knobs["warmup_steps"]
        assert type(steps) is int and 0 <= steps <= 10
        assert run.config.warmup_steps == steps
        assert run.trainer_kwargs["model"] == run.knobs["model"]
        assert type(run.config) is SFTConfig
    assert len({run.knobs["learning_rate"] for run in runs}) == 8


def test_random_search_log_range_spans_decades(cpu):
    config = RFSFTConfig(**cpu, learning_rate=Range(1e-6, 1e-2, log=True))
    runs = RandomSearch(num_runs=40, seed=0).expand(config)
    lrs = [run.config.learning_rate for run in runs]
    assert all(1e-6 <= lr < 1e-2 for lr in lrs)
    # Log-uniform: draws below 1e-4 (the log-midpoint) are common, not ~1% as linear would give.
    assert 8 <= sum(lr < 1e-4 for lr in lrs) <= 32


def test_random_search_identical_draws_are_warned_and_trained_once(cpu):
    config = RFSFTConfig(**cpu, learning_rate=List([1e-4, 1e-3]))
    with pytest.warns(UserWarning, match="identical to run-") as record:
        runs = RandomSearch(num_runs=10, seed=0).expand(config)
    assert 1 <= len(runs) <= 2
    assert [run.name for run in runs] == [f"run-{i}" for i in range(len(runs))]
    assert [run.index for run in runs] == list(range(len(runs)))
    values = [run.knobs["learning_rate"] for run in runs]
    assert len(set(values)) == len(values)
    duplicates = [
        w for w in record if issubclass(w.category, UserWarning) and "identical" in str(w.message)
    ]
    assert len(duplicates) == 10 - len(runs)


def test_random_search_without_knobs_gives_one_run(cpu):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        runs = RandomSearch(num_runs=3).expand(RFSFTConfig(**cpu))
    assert len(runs) == 1
    assert runs[0].knobs == {}


@pytest.mark.parametrize("num_runs", [0, -1, True, False, 2.0, 2.5, "3", None])
def test_random_search_num_runs_must_be_a_positive_int(num_runs):
    with pytest.raises(SearchError, match="num_runs >= 1"):
        RandomSearch(num_runs=num_runs)


@pytest.mark.parametrize("seed", ["0", 1.5, None, True])
def test_random_search_seed_must_be_an_int(seed):
    with pytest.raises(SearchError, match="seed must be an integer"):
        RandomSearch(num_runs=2, seed=seed)


def test_search_reprs():
    assert repr(GridSearch()) == "GridSearch()"
    assert "reward_funcs" in repr(GridSearch(zip=ZIP))
    assert repr(RandomSearch(num_runs=4, seed=2)) == "RandomSearch(num_runs=4, seed=2)"


# --------------------------------------------------------------------------------------------
# Pre-flight checks at expansion
# --------------------------------------------------------------------------------------------


def test_dpo_bad_loss_type_is_caught_before_training(cpu):
    config = RFDPOConfig(**cpu, loss_type=List(["sigmoid", "sigmod"]))
    with pytest.raises(SearchError) as err:
        GridSearch().expand(config)
    message = str(err.value)
    assert message.startswith("run-1")
    assert "loss_type" in message
    assert "'sigmod'" in message
    for valid in ("sigmoid", "ipo", "hinge"):
        assert f"'{valid}'" in message


def test_every_documented_dpo_loss_type_passes(cpu):
    allowed = allowed_values(DPOConfig, "loss_type")
    assert allowed is not None
    assert {"sigmoid", "ipo", "hinge"} <= allowed
    names = sorted(allowed)
    runs = GridSearch().expand(RFDPOConfig(**cpu, loss_type=List(names)))
    assert len(runs) == len(names)
    for run, name in zip(runs, names):
        assert type(run.config) is DPOConfig
        assert name in run.config.loss_type or run.config.loss_type == name


def test_dpo_combined_loss_types_pass(cpu):
    config = RFDPOConfig(**cpu, loss_type=List([["sigmoid", "sft"], ["ipo"]]))
    runs = GridSearch().expand(config)
    assert [list(run.config.loss_type) for run in runs] == [["sigmoid", "sft"], ["ipo"]]


def test_grpo_bad_loss_type_is_an_error(grpo_cpu):
    config = RFGRPOConfig(**grpo_cpu, loss_type=List(["dapo", "grpoo"]))
    with pytest.raises(SearchError) as err:
        GridSearch().expand(config)
    message = str(err.value)
    assert message.startswith("run-1")
    assert "loss_type" in message and "'grpoo'" in message
    assert "'dapo'" in message and "'grpo'" in message


def test_grpo_valid_loss_types_pass(grpo_cpu):
    config = RFGRPOConfig(**grpo_cpu, loss_type=List(["dapo", "grpo", "dr_grpo", "bnpo"]))
    runs = GridSearch().expand(config)
    assert [run.config.loss_type for run in runs] == ["dapo", "grpo", "dr_grpo", "bnpo"]


def test_grpo_batch_divisibility_names_the_run(grpo_cpu):
    config = RFGRPOConfig(**dict(grpo_cpu, num_generations=List([2, 3])))
    with pytest.raises(SearchError) as err:
        GridSearch().expand(config)
    message = str(err.value)
    assert message.startswith("run-1")
    assert "num_generations" in message
    assert "divisible" in message
    assert isinstance(err.value.__cause__, ValueError)


def test_value_trl_rejects_names_the_run_and_field(cpu):
    config = RFSFTConfig(**cpu, lr_scheduler_type=List(["linear", "bogus"]))
    with pytest.raises(SearchError) as err:
        GridSearch().expand(config)
    message = str(err.value)
    assert message.startswith("run-1")
    assert "lr_scheduler_type='bogus'" in message
    assert "SchedulerType" in message  # TRL's (transformers') own words are kept


def test_value_trl_rejects_as_first_candidate_fails_at_construction(cpu):
    with pytest.raises(ValueError, match="bogus"):
        RFSFTConfig(**cpu, lr_scheduler_type=List(["bogus", "linear"]))


def test_search_error_is_a_value_error():
    assert issubclass(SearchError, ValueError)


def _reward_a(completions, **kwargs):
    return [0.0 for _ in completions]


def _reward_b(completions, **kwargs):
    return [1.0 for _ in completions]


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("learning_rate", [1e-4, 1e-4]),
        ("learning_rate", [1e-4, 3e-4, 1e-4]),
        ("lr_scheduler_type", ["cosine", "linear", "cosine"]),
    ],
    ids=["floats", "floats-apart", "strings"],
)
def test_a_candidate_given_twice_is_an_error(cpu, field, values):
    config = RFSFTConfig(**cpu, **{field: List(values)})
    with pytest.raises(SearchError, match=f"`{field}` holds the candidate .* twice"):
        GridSearch().expand(config)


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("reward_funcs", [_reward_a, _reward_a]),
        ("reward_funcs", [[_reward_a, _reward_b], [_reward_a, _reward_b]]),
        ("peft_config", [LoraConfig(r=8, target_modules=["q_proj"]),
                         LoraConfig(r=8, target_modules=["q_proj"])]),
    ],
    ids=["functions", "function-lists", "lora-configs"],
)
def test_a_trainer_level_candidate_given_twice_is_an_error(cpu, name, values):
    config = RFSFTConfig(**cpu)
    with pytest.raises(SearchError, match="twice"):
        RandomSearch(4).expand(config, **{name: List(values)})


def test_duplicate_error_names_the_value_and_positions(cpu):
    config = RFSFTConfig(**cpu, learning_rate=List([1e-4, 3e-4, 1e-4]))
    with pytest.raises(SearchError) as err:
        GridSearch().expand(config)
    assert "0.0001" in str(err.value) and "positions 0 and 2" in str(err.value)


def test_a_knob_inside_a_candidate_config_object_is_a_clear_error(cpu):
    # (Knobs inside one config object are searched: tests/search/test_object_knobs.py.)
    from trl_rapidfire.search.searches import SearchError

    with pytest.raises(SearchError, match="has a knob inside it"):
        GridSearch().expand(RFSFTConfig(**cpu),
                            peft_config=List([LoraConfig(r=4), LoraConfig(r=List([8, 16]))]))
