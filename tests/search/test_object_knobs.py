"""Knobs inside a config object: LoraConfig(r=List([...]), target_modules=List([...]))."""

from __future__ import annotations

import pytest
from peft import LoraConfig

from trl_rapidfire import GridSearch, List, RandomSearch, Range, RFSFTConfig
from trl_rapidfire.control.ops import OpError, resolve_overrides
from trl_rapidfire.search.searches import Search, SearchError


@pytest.fixture
def cpu(tmp_path):
    return dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")


def test_grid_crosses_the_fields_of_a_lora_config(cpu):
    template = LoraConfig(r=List([4, 8]), lora_alpha=List([8, 16]),
                          target_modules=List([["q_proj"], ["q_proj", "v_proj"]]))
    config = RFSFTConfig(**cpu, learning_rate=List([1e-4, 1e-3]))
    runs = GridSearch().expand(config, peft_config=template)
    assert len(runs) == 16
    # Each field a knob of its own, named by its dotted path, in LoraConfig's field order.
    assert list(runs[0].knobs) == ["learning_rate", "peft_config.r",
                                   "peft_config.target_modules", "peft_config.lora_alpha"]
    seen = set()
    for run in runs:
        lora = run.trainer_kwargs["peft_config"]
        knobs = run.knobs
        # The very object a plain script would pass: made by LoraConfig from concrete values.
        assert lora == LoraConfig(r=knobs["peft_config.r"],
                                  lora_alpha=knobs["peft_config.lora_alpha"],
                                  target_modules=knobs["peft_config.target_modules"])
        assert isinstance(lora.target_modules, set)  # LoraConfig's own __post_init__ ran
        seen.add((knobs["learning_rate"], lora.r, lora.lora_alpha,
                  tuple(sorted(lora.target_modules))))
    assert len(seen) == 16
    assert isinstance(template.r, List)  # the user's object is left as written


def test_a_range_on_an_integer_field_draws_integers_and_the_rest_is_refused(cpu):
    runs = RandomSearch(num_runs=6, seed=3).expand(
        RFSFTConfig(**cpu),
        peft_config=LoraConfig(r=Range(2, 16), lora_dropout=Range(0.0, 0.2)))
    for run in runs:
        lora = run.trainer_kwargs["peft_config"]
        assert type(lora.r) is int and 2 <= lora.r <= 16
        assert isinstance(lora.lora_dropout, float) and 0.0 <= lora.lora_dropout < 0.2
    assert len({run.trainer_kwargs["peft_config"].r for run in runs}) > 1
    with pytest.raises(SearchError, match=r"peft_config.bias.*is not a number.*List\(\[\.\.\.\]\)"):
        RandomSearch(num_runs=2).expand(RFSFTConfig(**cpu),
                                        peft_config=LoraConfig(bias=Range(0, 1)))
    with pytest.raises(SearchError, match=r"`peft_config.r` takes an integer.*dtype=int"):
        RandomSearch(num_runs=2).expand(RFSFTConfig(**cpu),
                                        peft_config=LoraConfig(r=Range(2, 16, dtype=float)))


def test_a_knob_inside_a_candidate_of_a_list_is_still_a_clear_error(cpu):
    with pytest.raises(SearchError, match="has a knob inside it.*one LoraConfig"):
        GridSearch().expand(RFSFTConfig(**cpu),
                            peft_config=List([LoraConfig(r=4), LoraConfig(r=List([8, 16]))]))


def test_a_bad_combination_names_the_run_and_its_values(cpu):
    # LoraConfig's own check, run on the concrete values: loftq needs a loftq_config.
    with pytest.raises(SearchError, match=r"run-1 \(peft_config.init_lora_weights='loftq'\): "
                                          r"ValueError: `loftq_config` must be specified"):
        GridSearch().expand(RFSFTConfig(**cpu), peft_config=LoraConfig(
            init_lora_weights=List([True, "loftq"])))


def test_a_clone_changes_one_field_by_its_dotted_name(cpu):
    template = LoraConfig(r=List([4, 8]), lora_alpha=16, target_modules=["q_proj"])
    config = RFSFTConfig(**cpu)
    (parent, _) = GridSearch().expand(config, peft_config=template)
    overrides = resolve_overrides(
        {"peft_config.r": 32}, parent.knobs, {"peft_config.r": template.r}, {},
        parent.trainer_kwargs, untrusted=False)
    assert overrides == {"peft_config.r": 32}
    clone = Search.build_run("run-2", 2, {**parent.knobs, **overrides}, config,
                             parent.trainer_kwargs)
    assert clone.knobs == {"peft_config.r": 32}
    assert clone.trainer_kwargs["peft_config"] == LoraConfig(r=32, lora_alpha=16,
                                                             target_modules=["q_proj"])
    # A candidate of the declared List by its position, as for any List knob.
    picked = resolve_overrides(
        {"peft_config.r": {"candidate": 1}}, parent.knobs, {"peft_config.r": template.r}, {},
        parent.trainer_kwargs, untrusted=False)
    assert picked == {"peft_config.r": 8}
    with pytest.raises(OpError, match="no field 'rank'"):
        resolve_overrides({"peft_config.rank": 32}, parent.knobs, {}, {},
                          parent.trainer_kwargs, untrusted=False)
