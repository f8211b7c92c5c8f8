"""Issue 47, defect 5: every field a user sets in ``generation_config`` is checked when the RF
config is made (not at the run's first evaluation, after a chunk of training), with an error
naming the field, the value and the fix; the bounds are named constants."""

from __future__ import annotations

import math

import pytest
from transformers import GenerationConfig

from trl_rapidfire import List, RFConfigError, RFDPOConfig, RFSFTConfig
from trl_rapidfire.config.generation import MAX_BEAMS, MAX_NEW_TOKENS, generation_config_from


@pytest.fixture
def cpu(tmp_path):
    return dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")


@pytest.mark.parametrize(("fields", "message"), [
    ({"temperature": -1}, "`generation_config.temperature` is -1: it must be a finite number "
                          "> 0. Use e.g. temperature=0.7, or leave it unset"),
    ({"temperature": math.nan}, "`generation_config.temperature` is nan: it must be a finite "
                                "number > 0."),
    ({"do_sample": True, "temperature": 0.0}, "`generation_config.temperature` is 0.0"),
    ({"num_beams": 0}, f"`generation_config.num_beams` is 0: it must be an integer from 1 to "
                       f"{MAX_BEAMS}. Use e.g. num_beams=1"),
    ({"max_new_tokens": 10**12}, f"`generation_config.max_new_tokens` is 1000000000000: it "
                                 f"must be an integer from 1 to {MAX_NEW_TOKENS:,}. Use e.g. "
                                 "max_new_tokens=32."),
    ({"max_new_tokens": "3"}, "`generation_config.max_new_tokens` is '3': it must be an integer"),
    ({"max_new_tokens": True}, "`generation_config.max_new_tokens` is True: it must be an "),
    ({"top_p": 1.5}, "`generation_config.top_p` is 1.5: it must be a finite number in (0, 1]."),
    ({"top_k": -1}, "`generation_config.top_k` is -1: it must be an integer >= 0."),
    ({"repetition_penalty": math.inf}, "`generation_config.repetition_penalty` is inf"),
    ({"do_sample": "yes"}, "`generation_config.do_sample` is 'yes': it must be True or False."),
    ({"eos_token_id": [2, -1]}, "`generation_config.eos_token_id` is [2, -1]: it must be a "
                                "token id (an integer >= 0) or a list of them."),
    ({"num_return_sequences": 2}, "`generation_config.num_return_sequences` is 2: it must be 1."),
    ({"min_new_tokens": 9}, "`generation_config.min_new_tokens` is 9, over max_new_tokens 8."),
    ({"num_beams": 2, "num_beam_groups": 3}, "`generation_config.num_beam_groups` is 3, over "
                                             "num_beams 2"),
    ({"return_dict_in_generate": True}, "`generation_config.return_dict_in_generate` is True"),
])
def test_a_bad_field_is_refused_when_the_config_is_made(cpu, fields, message):
    with pytest.raises(RFConfigError) as caught:
        RFSFTConfig(**cpu, generation_config={"max_new_tokens": 8, **fields})
    assert message in str(caught.value)


def test_a_generation_config_object_json_text_and_each_candidate_of_a_knob_are_checked(cpu):
    with pytest.raises(RFConfigError, match=r"generation_config\.temperature` is -1\.0"):
        RFDPOConfig(**cpu, generation_config=GenerationConfig(max_new_tokens=4, do_sample=True,
                                                              temperature=-1.0))
    with pytest.raises(RFConfigError, match=r"generation_config\.max_new_tokens` is '3'"):
        RFSFTConfig(**cpu, generation_config='{"max_new_tokens": "3"}')
    with pytest.raises(RFConfigError, match=r"generation_config\.num_beams` is 0"):
        RFSFTConfig(**cpu, generation_config=List([{"max_new_tokens": 4},
                                                   {"max_new_tokens": 4, "num_beams": 0}]))


@pytest.mark.parametrize("fields", [
    {"max_new_tokens": MAX_NEW_TOKENS}, {"max_new_tokens": 4, "do_sample": False,
                                         "temperature": 0.0},
    {"max_new_tokens": 4, "do_sample": True, "temperature": 0.7, "top_p": 1.0, "top_k": 0},
    {"max_new_tokens": 4, "num_beams": MAX_BEAMS, "eos_token_id": [1, 2], "min_new_tokens": 4},
])
def test_values_within_the_bounds_are_kept(cpu, fields):
    config = RFSFTConfig(**cpu, generation_config=fields)
    made = generation_config_from(config.generation_config, "generation_config")
    assert {key: getattr(made, key) for key in fields} == fields


def test_max_new_tokens_is_still_required():
    with pytest.raises(RFConfigError, match="needs max_new_tokens"):
        generation_config_from({"do_sample": False}, "generation_config")
