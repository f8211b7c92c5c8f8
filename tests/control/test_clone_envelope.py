"""What a clone from outside (a run tag, an op file, the CLI, a panel) may ask is bounded by one
declared envelope, checked before anything is built: the experiment's knobs within a factor of
their candidates' span, the parent's own values within that factor for other fields, a short
list of safe fields; on top, a resource estimate against the machine. The author's own Python
ops get the estimate as a warning. No trainer kind has code of its own."""

from __future__ import annotations

import json
import os
import time
import warnings

import pytest
from mlflow import MlflowClient
from trl import DPOConfig, GRPOConfig, SFTConfig

from trl_rapidfire import List, Range, RFConfigError, RFGRPOConfig, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.config.generation import MAX_NEW_TOKENS, MIN_SAMPLING_TEMPERATURE
from trl_rapidfire.control.clone_resources import (
    MAX_GENERATION_TOKENS,
    ModelShape,
    estimate,
    model_shape_of,
)
from trl_rapidfire.control.envelope import SPAN_FACTOR
from trl_rapidfire.control.folder_control import Inbox
from trl_rapidfire.control.ops import OpError, resolve_overrides
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BASE = {k: v for k, v in cpu_training_kwargs().items() if k != "report_to"}
BASE.update(per_device_train_batch_size=4, logging_steps=1)
SHAPE = ModelShape(hidden_size=64, num_layers=2, vocab_size=393, intermediate_size=128,
                   context=512)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _sft_fields(**changes):
    """A parent's config fields as TRL's SFTConfig has them by default (pad_to_multiple_of:
    RapidFire's)."""
    fields = {"learning_rate": 2e-5, "max_length": 1024, "packing": False,
              "dataloader_num_workers": 0, "dataloader_prefetch_factor": None,
              "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
              "weight_decay": 0.0, "pad_to_multiple_of": "auto"}
    return {**fields, **changes}


def _tag(overrides, *, fields=None, knobs=None, parent=None, allowed=(), cls=SFTConfig,
         trainer_args=None, untrusted=True):
    """``overrides`` as a tag's clone op of a parent with LoRA rank 4 on the tiny model."""
    trainer_args = {"model": tiny_model_path(), "peft_config": tiny_lora_config(r=4),
                    **(trainer_args or {})}
    return resolve_overrides(overrides, parent or {}, knobs or {}, fields or _sft_fields(),
                             trainer_args, untrusted=untrusted, allowed=allowed,
                             config_class=cls)


# Each of what a fuzz pass found accepted, and the words its refusal must hold.
FOUND = [
    ({"peft_config.r": 2000000}, ["peft_config.r", "2000000", "1 to 16", "clone_overrides"]),
    ({"peft_config.rank_pattern": {"q_proj": 2000000}}, ["rank_pattern", "2000000", "16"]),
    ({"dataloader_prefetch_factor": 1e9}, ["dataloader_prefetch_factor", "1000000000",
                                           "clone_overrides"]),
    ({"dataloader_num_workers": 300}, ["dataloader_num_workers", "300", "from 0 to 0"]),
    ({"max_length": 1e9, "packing": True}, ["max_length", "1000000000", "4096"]),
]


@pytest.mark.parametrize(("overrides", "words"), FOUND)
def test_what_the_fuzz_pass_found_is_refused_naming_field_value_limit_and_fix(
        overrides, words):
    started = time.perf_counter()
    with pytest.raises(OpError) as raised:
        _tag(overrides)
    for word in words:
        assert word in str(raised.value), (word, str(raised.value))
    assert time.perf_counter() - started < 2


def test_a_grpo_and_a_dpo_clone_are_held_by_the_same_rule_with_no_code_of_their_own():
    grpo = {"max_completion_length": 256, "num_generations": 8, "temperature": 1.0,
            "generation_kwargs": None, "learning_rate": 1e-6}
    for overrides, word in (({"max_completion_length": 1000000}, "max_completion_length"),
                            ({"generation_kwargs": {"max_new_tokens": 1000000}},
                             "max_new_tokens"),
                            ({"num_generations": 4096}, "num_generations")):
        with pytest.raises(OpError, match=word):
            _tag(overrides, fields=grpo, cls=GRPOConfig)
    assert _tag({"max_completion_length": 512, "learning_rate": 3e-6}, fields=grpo,
                cls=GRPOConfig) == {"max_completion_length": 512, "learning_rate": 3e-6}
    dpo = {"max_length": 1024, "beta": 0.1}
    with pytest.raises(OpError, match="max_length"):
        _tag({"max_length": 10**9}, fields=dpo, cls=DPOConfig)
    assert _tag({"max_length": 2048, "beta": 0.5}, fields=dpo, cls=DPOConfig) == {
        "max_length": 2048, "beta": 0.5}


def test_a_clone_within_the_span_and_the_safe_fields_are_accepted():
    knobs = {"learning_rate": List([1e-4, 1e-3]), "per_device_train_batch_size": Range(2, 8,
                                                                                       dtype=int)}
    parent = {"learning_rate": 1e-4, "per_device_train_batch_size": 4}
    # A knob: a factor around its candidates' span, both ways.
    assert _tag({"learning_rate": 1e-3 * SPAN_FACTOR, "per_device_train_batch_size": 32},
                knobs=knobs, parent=parent) == {"learning_rate": 4e-3,
                                                "per_device_train_batch_size": 32}
    with pytest.raises(OpError, match="from 0 to 32"):
        _tag({"per_device_train_batch_size": 33}, knobs=knobs, parent=parent)
    # Not a knob: a factor around the parent's value; the safe fields whatever they are.
    assert _tag({"peft_config.r": 16, "gradient_accumulation_steps": 4, "weight_decay": 0.3,
                 "pad_to_multiple_of": 8})["pad_to_multiple_of"] == 8
    with pytest.raises(OpError, match="from 0 to 4"):
        _tag({"gradient_accumulation_steps": 5})
    with pytest.raises(OpError, match="1 to 128"):
        _tag({"pad_to_multiple_of": 100000})
    # None where the experiment declared a number would lift a bound.
    with pytest.raises(OpError, match="max_length"):
        _tag({"max_length": None})


def test_the_authors_clone_overrides_widen_the_span_not_the_machine():
    assert _tag({"peft_config.r": 64}, allowed=("peft_config",))["peft_config"].r == 64
    assert _tag({"dataloader_num_workers": 1}, allowed=("dataloader_num_workers",)) == {
        "dataloader_num_workers": 1}
    # Widened, but past what the machine holds: the estimate still refuses.
    with pytest.raises(OpError) as raised:
        _tag({"peft_config.r": 200_000_000}, allowed=("peft_config",))
    message = str(raised.value)
    assert "`peft_config.r`=200000000" in message and "this machine has free" in message
    assert "adapter and optimizer" in message
    with pytest.raises(OpError, match="activations") as raised:
        _tag({"max_length": 10**9, "packing": True}, allowed=("max_length",))
    assert "`max_length`=1000000000" in str(raised.value)
    grpo = {"max_completion_length": 256, "num_generations": 8}
    with pytest.raises(OpError, match="context window of 512 tokens"):
        _tag({"max_completion_length": 10**6}, fields=grpo, cls=GRPOConfig,
             allowed=("max_completion_length",))
    cpus = os.cpu_count() or 1
    with pytest.raises(OpError, match=f"this machine's {cpus} CPUs"):
        _tag({"dataloader_num_workers": cpus + 1}, allowed=("dataloader_num_workers",))
    with pytest.raises(OpError, match="MAX_PREFETCH_FACTOR=16"):
        _tag({"dataloader_prefetch_factor": 10**9}, allowed=("dataloader_prefetch_factor",))


def test_the_authors_python_op_keeps_its_freedom_with_the_estimate_as_a_warning():
    with pytest.warns(RuntimeWarning, match="MAX_PREFETCH_FACTOR"):
        out = _tag({"dataloader_prefetch_factor": 10**9}, untrusted=False)
    assert out == {"dataloader_prefetch_factor": 10**9}
    with pytest.warns(RuntimeWarning, match="this machine has free"):
        assert _tag({"peft_config.r": 200_000_000},
                    untrusted=False)["peft_config"].r == 200_000_000
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clone the machine holds: no warning
        _tag({"peft_config.r": 64}, untrusted=False)


def test_the_estimate_reads_the_models_shape_and_grows_with_what_sizes_work():
    assert model_shape_of(tiny_model_path()) == SHAPE
    assert model_shape_of("no-such/model-anywhere") is None
    assert MAX_GENERATION_TOKENS == MAX_NEW_TOKENS
    base = {"per_device_train_batch_size": 4, "max_length": 128,
            "peft_config": tiny_lora_config(r=4)}
    small = estimate(base, SHAPE)
    assert estimate({**base, "peft_config": tiny_lora_config(r=8)}, SHAPE).adapter == (
        2 * small.adapter)
    assert estimate({**base, "max_length": 256}, SHAPE).activations == 2 * small.activations
    assert estimate({**base, "dataloader_num_workers": 2}, SHAPE).loader > 0
    assert estimate({**base, "max_completion_length": 64}, SHAPE).generation > 0


def test_sampling_settings_that_fail_after_a_chunk_are_refused_when_the_config_is_made(
        tmp_path):
    common = dict(output_dir=str(tmp_path), **BASE)
    cases = [
        ({"max_new_tokens": 8, "do_sample": True, "temperature": 1e-300}, "temperature"),
        ({"max_new_tokens": 8, "stop_strings": ["\n"]}, "stop_strings"),
    ]
    for generation, word in cases:
        with pytest.raises(RFConfigError, match=word) as raised:
            RFSFTConfig(**common, generation_config=generation)
        assert "Use e.g." in str(raised.value) or "leave stop_strings unset" in str(
            raised.value)
    # Greedy never reads it; a sampling temperature at the floor is fine.
    RFSFTConfig(**common, generation_config={"max_new_tokens": 8, "do_sample": False,
                                             "temperature": 1e-300})
    RFSFTConfig(**common, generation_config={"max_new_tokens": 8, "do_sample": True,
                                             "temperature": MIN_SAMPLING_TEMPERATURE})
    grpo = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                **{k: v for k, v in BASE.items() if k != "per_device_train_batch_size"})
    with pytest.raises(RFConfigError, match="MIN_SAMPLING_TEMPERATURE"):
        RFGRPOConfig(**grpo, temperature=List([1.0, 1e-300]))
    with pytest.raises(RFConfigError, match="max_new_tokens"):
        RFGRPOConfig(**grpo, generation_kwargs={"max_new_tokens": 10**6})


def _trainer(out, **kw):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         max_steps=2, **BASE, **kw),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
    )


def test_ops_from_a_tag_and_the_inbox_are_held_to_the_envelope_while_training(
        tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    out = tmp_path / "exp"
    rf = _trainer(out, report_to="mlflow")
    tracker = rf.engine.tracker
    bombs = ['clone {"peft_config.r": 2000000}', 'clone {"dataloader_prefetch_factor": 1e9}',
             'clone {"dataloader_num_workers": 300}',
             'clone {"max_length": 1e9, "packing": true}',
             'clone ' + json.dumps({"generation_config": {"max_new_tokens": 8, "do_sample": True,
                                                          "temperature": 1e-300}})]
    good = ['clone {"pad_to_multiple_of": 8}', 'clone {"learning_rate": 0.005}']
    tracker.client.set_tag(tracker.run_id("run-0"), "rapidfire.op", bombs[0])
    inbox = Inbox(Layout(out))
    for op in bombs[1:] + good:
        inbox.post("run-1", op)
    # The author's own clone with the same sampling bomb: a clear error at the op.
    rf.clone("run-1", {"generation_config": {"max_new_tokens": 8, "do_sample": True,
                                             "temperature": 1e-300}})
    tracker.poll_now()
    rf.train()
    answers = {r.op: r.result for r in rf.op_log}
    for op in bombs:
        assert answers[op].startswith("error: "), (op, answers[op])
    assert "`peft_config.r`=2000000" in answers[bombs[0]]
    assert all(answers[op].startswith("ok: created run-") for op in good), answers
    python_op = [r for r in rf.op_log if r.source == "python"][0]
    assert python_op.result.startswith("error: ") and "temperature" in python_op.result
    assert "MIN_SAMPLING_TEMPERATURE" in python_op.result
    # The good clones trained; nothing of a refused clone is left.
    assert {r.name: r.status for r in rf.runs} == {f"run-{i}": RunStatus.COMPLETED
                                                    for i in range(4)}
    tracker.flush()
    tags = MlflowClient(tracker.uri).get_run(tracker.run_id("run-0")).data.tags
    assert tags["rapidfire.op.result"] == answers[bombs[0]]
