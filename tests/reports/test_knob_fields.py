"""A knob whose values are config objects is shown by its fields: ``expand_knobs`` on each
form a view gets such a value in (trl_rapidfire/reports/knob_fields.py), and ``status``
showing the field that differs as a column of its own."""

from __future__ import annotations

import json

import pytest
from transformers import GenerationConfig

from trl_rapidfire.config.knobs import describe_value
from trl_rapidfire.reports.display import differing_keys
from trl_rapidfire.reports.knob_fields import MAX_TEXT, config_fields, expand_knobs
from trl_rapidfire.testing import tiny_lora_config

ALPHAS = (16, 32)


def _loras():
    return [tiny_lora_config(r=8, lora_alpha=a) for a in ALPHAS]


@pytest.mark.parametrize("form", ["object", "text", "json"])
def test_each_form_of_a_lora_knob_gives_the_same_columns(form):
    # RunResult.knobs: the object; the shared state and MLflow params: describe_value's text;
    # the browser panel's JSON of the fields: a dict.
    shown = {"object": lambda c: c, "text": describe_value,
             "json": lambda c: json.loads(json.dumps(config_fields(c), default=str))}[form]
    rows = [{"learning_rate": 1e-3, "peft_config": shown(c)} for c in _loras()]
    expanded = expand_knobs(rows)
    assert [row["peft_config.lora_alpha"] for row in expanded] == list(ALPHAS)
    assert all(row["peft_config.r"] == 8 for row in expanded)
    assert all(row["peft_config.target_modules"] == ["q_proj", "v_proj"] for row in expanded)
    assert "peft_config" not in expanded[0]
    # The one rule of the tables then shows the field that differs, alone.
    assert differing_keys(expanded) == ["peft_config.lora_alpha"]
    assert rows[0]["peft_config"] == shown(_loras()[0])  # the rows given are left as they are


def test_a_knob_whose_objects_are_the_same_stays_one_value():
    same = [{"peft_config": describe_value(tiny_lora_config(r=8))} for _ in range(2)]
    assert expand_knobs(same) == same
    single = [{"peft_config": tiny_lora_config(r=8)}]
    assert expand_knobs(single) == single


def test_a_run_without_an_object_keeps_the_knob_whole_beside_the_fields_that_differ():
    lora16, lora32 = (describe_value(c) for c in _loras())
    rows = expand_knobs([{"peft_config": None}, {"peft_config": lora16},
                         {"peft_config": lora32}])
    # The fields the LoRA runs share would differ only as "missing" in the full fine-tune.
    assert rows == [{"peft_config": None}, {"peft_config.lora_alpha": 16},
                    {"peft_config.lora_alpha": 32}]


def test_a_generation_config_and_a_dict_expand_by_their_fields():
    rows = expand_knobs([{"generation_config": GenerationConfig(temperature=t, top_p=0.9,
                                                                do_sample=True)}
                         for t in (0.7, 1.0)])
    assert differing_keys(rows) == ["generation_config.temperature"]
    assert [r["generation_config.temperature"] for r in rows] == [0.7, 1.0]
    rows = expand_knobs([{"g": {"temperature": 0.7, "top_p": 0.9}},
                         {"g": {"temperature": 1.0, "top_p": 0.9}}])
    assert differing_keys(rows) == ["g.temperature"]


@pytest.mark.parametrize("odd", [
    "LoraConfig(r=8, peft_type=<PeftType.LORA: 'LORA'>)",  # a full repr: not Python
    "(" * 5000 + ")" * 5000,  # nested past any parser's depth
    "LoraConfig(" + "r=8, " * 2000 + ")",  # longer than any text we write
    "__import__('os').system('echo no')",  # a call, not of keywords: never evaluated
    "LoraConfig(8, lora_alpha=16)",  # a positional argument
    "LoraConfig(**{'r': 8})",
    "x" * (MAX_TEXT + 1),
    "",
])
def test_odd_text_never_raises_and_stays_the_whole_value(odd):
    rows = [{"peft_config": odd}, {"peft_config": describe_value(_loras()[0])}]
    expanded = expand_knobs(rows)
    assert expanded[0] == {"peft_config": odd}
    assert config_fields(odd) is None


def test_a_nested_object_in_text_stays_its_text():
    fields = config_fields("LoraConfig(r=8, runtime_config=LoraRuntimeConfig(x=1))")
    assert fields == {"r": 8, "runtime_config": "LoraRuntimeConfig(x=1)"}


def test_status_shows_the_field_that_differs_as_a_column():
    from trl_rapidfire.client.experiments import knob_columns, tracked_knobs

    # As MLflow holds them: the knobs tag, and each knob's param as describe_value's text.
    params = [{"learning_rate": "0.001", "peft_config": describe_value(c),
               "output_dir": f"out/runs/run-{i}"} for i, c in enumerate(_loras())]
    tags = [{"rapidfire.run": f"run-{i}", "rapidfire.knobs": '["peft_config"]'}
            for i in range(2)]
    cols = knob_columns(*tracked_knobs(params, tags))
    assert cols.names == ["peft_config.lora_alpha"]
    assert cols.cells == [["16"], ["32"]]
