"""Tests for ``trl_rapidfire.config.knobs``: the ``List`` and ``Range`` knobs and their JSON
form."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from peft import LoraConfig

from trl_rapidfire.config.knobs import KnobError, List, Range, is_knob, knob_from_json


def reward_a(completions, **kwargs):
    return [1.0 for _ in completions]


def reward_b(completions, **kwargs):
    return [0.0 for _ in completions]


def draws(knob, n, seed=0):
    rng = random.Random(seed)
    return [knob.sample(rng) for _ in range(n)]


# --------------------------------------------------------------------------------------------
# List
# --------------------------------------------------------------------------------------------


def test_list_keeps_candidates_of_any_type_in_order():
    lora_small = LoraConfig(r=4, target_modules=["q_proj"])
    lora_big = LoraConfig(r=16, target_modules=["q_proj", "v_proj"])
    candidates = [
        2e-4,
        3,
        "cosine",
        None,
        lora_small,
        lora_big,
        reward_a,
        [reward_a, reward_b],
        [reward_b],
    ]
    knob = List(candidates)

    assert len(knob) == len(candidates)
    assert list(knob) == candidates
    assert knob.values == tuple(candidates)
    for i, value in enumerate(candidates):
        assert knob[i] is value
    assert knob[-1] is candidates[-1]
    # The objects themselves are kept, not copies.
    assert knob[4] is lora_small and knob[6] is reward_a
    assert is_knob(knob)
    assert not is_knob(candidates)


def test_list_accepts_any_sequence_and_a_single_candidate():
    assert List((1, 2, 3)).values == (1, 2, 3)
    assert List(range(3)).values == (0, 1, 2)
    assert List(["only"]).values == ("only",)
    assert len(List([1e-4])) == 1


def test_list_is_not_affected_by_later_changes_to_the_given_list():
    values = [1, 2]
    knob = List(values)
    values.append(3)
    assert knob.values == (1, 2)


def test_empty_list_is_an_error_asking_for_a_value():
    with pytest.raises(KnobError, match=r"(?i)give at least one value"):
        List([])
    with pytest.raises(KnobError, match=r"(?i)no candidates"):
        List(())


@pytest.mark.parametrize(
    "bad",
    ["abc", b"abc", 5, 1e-4, None, {1, 2}, {"a": 1}, (x for x in [1, 2])],
    ids=["str", "bytes", "int", "float", "None", "set", "dict", "generator"],
)
def test_list_of_a_non_sequence_or_string_is_an_error(bad):
    with pytest.raises(KnobError, match=r"List\(\.\.\.\) takes a sequence"):
        List(bad)


def test_list_error_is_a_value_error():
    # Callers catching ValueError (like TRL's own validation errors) also catch knob errors.
    assert issubclass(KnobError, ValueError)


def test_equal_values_of_different_types_are_not_duplicates():
    assert List([1, 1.0]).values == (1, 1.0)
    assert [type(v) for v in List([1, 1.0])] == [int, float]
    assert len(List([0, False])) == 2
    assert len(List([1, True, 1.0])) == 3


def test_distinct_lora_configs_are_not_duplicates():
    knob = List(
        [LoraConfig(r=8, target_modules=["q_proj"]), LoraConfig(r=8, target_modules=["v_proj"])]
    )
    assert len(knob) == 2


def test_list_to_json():
    assert List([1e-4, 3e-4]).to_json() == {"List": [1e-4, 3e-4]}
    assert List(["linear", None, True, 2]).to_json() == {"List": ["linear", None, True, 2]}
    assert List([reward_a, [reward_a, reward_b]]).to_json() == {
        "List": ["reward_a", ["reward_a", "reward_b"]]
    }
    assert List([(1, 2), {"k": 3}]).to_json() == {"List": [[1, 2], {"k": 3}]}
    lora_json = List([LoraConfig(r=8)]).to_json()["List"][0]
    assert isinstance(lora_json, str) and lora_json.startswith("LoraConfig(") and "r=8" in lora_json


def test_list_equality():
    assert List([1, 2]) == List([1, 2])
    assert List([1, 2]) == List((1, 2))
    assert hash(List([1, 2])) == hash(List([1, 2]))
    assert List([1, 2]) != List([2, 1])
    assert List([1, 2]) != List([1, 2, 3])
    assert List([1, 2]) != List([1.0, 2.0])
    assert List([1, 2]) != [1, 2]
    assert List([1, 2]) != Range(1, 2)
    assert List([reward_a]) == List([reward_a])
    assert List([reward_a]) != List([reward_b])
    assert List([LoraConfig(r=8)]) == List([LoraConfig(r=8)])


def test_list_sampling_is_uniform_and_deterministic():
    knob = List(["a", "b", "c"])
    picked = draws(knob, 3000, seed=1)
    assert draws(knob, 3000, seed=1) == picked
    for value in "abc":
        assert 800 < picked.count(value) < 1200


# --------------------------------------------------------------------------------------------
# Range
# --------------------------------------------------------------------------------------------


def test_float_range_draws_lie_in_half_open_interval():
    knob = Range(0.1, 0.3)
    values = draws(knob, 2000)
    assert all(isinstance(v, float) for v in values)
    assert all(0.1 <= v < 0.3 for v in values)
    # Spread over the whole interval, not stuck at one end.
    assert min(values) < 0.11 and max(values) > 0.29


def test_int_range_draws_are_ints_hitting_both_ends():
    knob = Range(1, 5, dtype=int)
    values = draws(knob, 500)
    assert all(type(v) is int for v in values)
    assert set(values) == {1, 2, 3, 4, 5}


def test_int_range_accepts_integral_float_bounds():
    knob = Range(2.0, 4.0, dtype=int)
    assert knob.low == 2 and type(knob.low) is int
    assert set(draws(knob, 300)) == {2, 3, 4}


def test_log_int_range_draws_are_ints_in_closed_interval():
    knob = Range(1, 8, log=True, dtype=int)
    values = draws(knob, 4000)
    assert all(type(v) is int for v in values)
    assert set(values) == set(range(1, 9))
    # Log-uniform: small values are far more likely than large ones.
    assert values.count(1) > 3 * values.count(8)


def test_log_range_is_log_uniform():
    log_values = draws(Range(1e-5, 1e-1, log=True), 4000)
    assert all(1e-5 <= v < 1e-1 for v in log_values)
    below = sum(v < 1e-3 for v in log_values) / len(log_values)
    # 1e-3 is the log-midpoint of [1e-5, 1e-1]: about half the draws fall below it.
    assert 0.45 < below < 0.55
    # Each decade gets about a quarter of the draws.
    for lo in (1e-5, 1e-4, 1e-3, 1e-2):
        share = sum(lo <= v < lo * 10 for v in log_values) / len(log_values)
        assert 0.2 < share < 0.3

    linear_values = draws(Range(1e-5, 1e-1), 4000)
    linear_below = sum(v < 1e-3 for v in linear_values) / len(linear_values)
    assert linear_below < 0.03


def test_range_draws_are_deterministic_given_the_seed():
    for knob in (Range(0.0, 1.0), Range(1e-6, 1e-2, log=True), Range(0, 100, dtype=int)):
        assert draws(knob, 50, seed=7) == draws(knob, 50, seed=7)
        assert draws(knob, 50, seed=7) != draws(knob, 50, seed=8)


def test_range_attributes_and_repr():
    knob = Range(1e-5, 1e-3, log=True)
    assert (knob.low, knob.high, knob.log, knob.dtype) == (1e-5, 1e-3, True, float)
    assert repr(knob) == "Range(1e-05, 0.001, log=True)"
    assert repr(Range(1, 4, dtype=int)) == "Range(1, 4, dtype=int)"
    assert Range(1, 2) == Range(1.0, 2.0)
    assert hash(Range(1, 2)) == hash(Range(1.0, 2.0))
    assert Range(1, 2) != Range(1, 2, log=True)
    assert Range(1, 2) != Range(1, 2, dtype=int)
    assert Range(1, 2) != Range(1, 3)
    assert is_knob(knob)


@pytest.mark.parametrize(
    ("low", "high"),
    [(1e-3, 1e-5), (1.0, 1.0), (5, 5), (0.0, -1.0)],
    ids=["reversed", "equal-float", "equal-int", "negative"],
)
def test_range_needs_low_below_high(low, high):
    with pytest.raises(KnobError, match="low < high"):
        Range(low, high)


@pytest.mark.parametrize(
    ("low", "high", "bad"),
    [
        ("1e-5", 1e-3, "low"),
        (1e-5, "1e-3", "high"),
        (None, 1.0, "low"),
        (0.0, None, "high"),
        (True, 5, "low"),
        (0, False, "high"),
        ([0], 1, "low"),
    ],
    ids=["str-low", "str-high", "None-low", "None-high", "bool-low", "bool-high", "list-low"],
)
def test_range_bounds_must_be_numbers(low, high, bad):
    with pytest.raises(KnobError, match=f"Range {bad} must be a number"):
        Range(low, high)


def test_range_rejects_nan_and_infinite_bounds():
    with pytest.raises(KnobError, match=r"low must be a number.*nan"):
        Range(math.nan, 1.0)
    with pytest.raises(KnobError, match=r"high must be a number.*nan"):
        Range(0.0, float("nan"))
    with pytest.raises(KnobError, match="high must be finite"):
        Range(0.0, math.inf)
    with pytest.raises(KnobError, match="low must be finite"):
        Range(-math.inf, 0.0)


@pytest.mark.parametrize("low", [0, 0.0, -1e-3])
def test_log_range_needs_positive_low(low):
    with pytest.raises(KnobError, match=r"log=True.*low > 0"):
        Range(low, 1.0, log=True)


@pytest.mark.parametrize(("low", "high"), [(0.5, 3), (1, 3.5), (0.1, 0.9)])
def test_int_range_needs_integer_bounds(low, high):
    with pytest.raises(KnobError, match="dtype=int.*integer bounds"):
        Range(low, high, dtype=int)


@pytest.mark.parametrize("dtype", [str, "int", bool, complex, None])
def test_range_rejects_unknown_dtype(dtype):
    with pytest.raises(KnobError, match="dtype must be int or float"):
        Range(0, 1, dtype=dtype)


def test_range_accepts_numpy_scalar_bounds():
    knob = Range(np.int64(1), np.int64(10), dtype=int)
    assert (knob.low, knob.high) == (1, 10)
    assert type(knob.low) is int
    knob = Range(np.float32(0.25), np.float32(0.5))
    assert 0.25 <= knob.sample(random.Random(0)) < 0.5


# --------------------------------------------------------------------------------------------
# knob_from_json
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "knob",
    [
        List([1e-4, 3e-4]),
        List(["linear", "cosine", None]),
        List([[1.0, 0.0], [0.5, 0.5]]),
        Range(1e-5, 1e-3),
        Range(1e-5, 1e-3, log=True),
        Range(1, 8, dtype=int),
        Range(1, 64, log=True, dtype=int),
    ],
    ids=repr,
)
def test_knob_json_round_trip(knob):
    spec = knob.to_json()
    back = knob_from_json(spec)
    assert back == knob
    assert type(back) is type(knob)
    assert back.to_json() == spec


def test_knob_from_json_list_and_range_forms():
    assert knob_from_json({"List": [1e-4, 3e-4]}) == List([1e-4, 3e-4])

    full = knob_from_json({"Range": {"low": 1, "high": 32, "log": True, "dtype": "int"}})
    assert full == Range(1, 32, log=True, dtype=int)
    assert full.to_json() == {"Range": {"low": 1, "high": 32, "log": True, "dtype": "int"}}

    short = knob_from_json({"Range": [1e-5, 1e-3]})
    assert short == Range(1e-5, 1e-3)
    assert short.to_json() == {"Range": {"low": 1e-5, "high": 1e-3}}
    assert knob_from_json({"Range": (0, 1)}) == Range(0.0, 1.0)

    assert knob_from_json({"Range": {"low": 0.1, "high": 0.5, "dtype": "float"}}) == Range(0.1, 0.5)
    assert knob_from_json({"Range": {"low": 0.1, "high": 0.5, "log": False}}) == Range(0.1, 0.5)


def test_range_to_json_omits_defaults():
    assert Range(0.1, 0.5).to_json() == {"Range": {"low": 0.1, "high": 0.5}}
    assert Range(1e-5, 1e-3, log=True).to_json() == {
        "Range": {"low": 1e-5, "high": 1e-3, "log": True}
    }
    spec = Range(1, 4, dtype=int).to_json()
    assert spec == {"Range": {"low": 1, "high": 4, "dtype": "int"}}
    assert type(spec["Range"]["low"]) is int


@pytest.mark.parametrize(
    "value",
    [
        {"lr": 1e-4},
        {"last": 5},
        {},
        [1, 2],
        "List",
        None,
        1e-4,
    ],
    ids=repr,
)
def test_knob_from_json_returns_none_for_non_knobs(value):
    assert knob_from_json(value) is None


def test_knob_from_json_passes_knobs_through_as_none():
    # Only the JSON form is read; an already-built knob is not a JSON mapping.
    assert knob_from_json(List([1])) is None


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"List": []}, "no candidates"),
        ({"List": "abc"}, "takes a sequence"),
        ({"List": 3}, "takes a sequence"),
        ({"Range": {"low": 1}}, "needs keys low, high"),
        ({"Range": {"high": 1}}, "needs keys low, high"),
        ({"Range": {"low": 0, "high": 1, "step": 0.1}}, "needs keys low, high"),
        ({"Range": {"low": 0, "high": 1, "dtype": "str"}}, "dtype"),
        ({"Range": {"low": 0, "high": 1, "dtype": int}}, "dtype"),
        ({"Range": {"low": 2, "high": 1}}, "low < high"),
        ({"Range": {"low": "1e-5", "high": 1e-3}}, "must be a number"),
        ({"Range": {"low": 0, "high": 1, "log": True}}, "low > 0"),
        ({"Range": {"low": 0.5, "high": 2, "dtype": "int"}}, "integer bounds"),
        ({"Range": [1]}, "must be"),
        ({"Range": [0, 1, 2]}, "must be"),
        ({"Range": 1.0}, "must be"),
        ({"Range": "0..1"}, "must be"),
        ({"list": [1, 2]}, "'list' is not a knob.*{List: \\[1, 2\\]}"),
        ({"Lst": [1, 2]}, "'Lst' is not a knob.*'List' exactly"),
        ({"range": [0, 1]}, "'range' is not a knob.*{Range: {low: "),
        ({"RANGES": {"low": 0, "high": 1}}, "'RANGES' is not a knob"),
        ({"List": [1, 2], "Range": [0, 1]}, "only key.*'Range'"),
        ({"List": [1, 2], "extra": 1}, "only key.*'extra'"),
    ],
    ids=repr,
)
def test_knob_from_json_bad_specs_raise(spec, match):
    with pytest.raises(KnobError, match=match):
        knob_from_json(spec)


def test_knob_from_json_rejects_non_bool_log():
    with pytest.raises(KnobError, match="log"):
        knob_from_json({"Range": {"low": 0.1, "high": 1.0, "log": "false"}})


def test_a_lora_config_is_described_by_rank_alpha_and_targets():
    from peft import LoraConfig

    from trl_rapidfire.config.knobs import describe_value

    assert describe_value(LoraConfig(r=8, lora_alpha=16, target_modules=["v_proj", "q_proj"])) \
        == "LoraConfig(r=8, alpha=16, targets=['q_proj', 'v_proj'])"
    assert describe_value(LoraConfig(r=32, lora_alpha=64, target_modules="all-linear")) \
        == "LoraConfig(r=32, alpha=64, targets='all-linear')"


def test_lora_configs_that_differ_elsewhere_are_described_apart():
    from peft import LoraConfig

    from trl_rapidfire.config.knobs import describe_value

    plain = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj"], task_type="CAUSAL_LM")
    dropout = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj"], lora_dropout=0.1,
                         use_rslora=True, task_type="CAUSAL_LM")
    assert describe_value(plain) == "LoraConfig(r=8, alpha=16, targets=['q_proj'])"
    assert describe_value(dropout) == ("LoraConfig(r=8, alpha=16, targets=['q_proj'], "
                                       "lora_dropout=0.1, use_rslora=True)")
