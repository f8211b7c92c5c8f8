"""Bad ops change nothing but their result: each is rejected with a clear message and the runs
finish exactly as they would have without it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.control.ops import OpError, parse_op, resolve_overrides
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

# (run, op text, a fragment the result must contain)
BAD_OPS = [
    ("run-0", "", "empty op"),
    ("run-0", "   ", "empty op"),
    ("run-0", "pause", "unknown op 'pause'"),
    ("run-0", "stop now", "takes no argument"),
    ("run-0", "delete everything", "takes no argument"),
    ("run-0", "resume", "only a stopped run can be resumed"),
    ("run-9", "stop", "no run named 'run-9'"),
    ("run-0", "clone {", "not valid JSON"),
    ("run-0", "clone [1, 2]", "must be a JSON object"),
    ("run-0", 'clone {"nope": 1}', "unknown knob 'nope'"),
    ("run-0", 'clone {"learning_rate": "fast"}', "takes a number"),
    ("run-0", 'clone {"learning_rate": [1e-4, 1e-3]}', "takes a number"),
    ("run-0", 'clone {"learning_rate": {"candidate": 5}}', "index in 0..1"),
    ("run-0", 'clone {"lr_scheduler_type": "bogus"}', "invalid clone of run-0"),
    ("run-0", 'clone {"warmup_steps": -1}', "invalid clone of run-0"),
    ("run-0", 'clone {"num_chunks": 2}', "describes the whole experiment"),
    ("run-0", 'clone {"output_dir": "elsewhere"}', "describes the whole experiment"),
    ("run-0", 'clone {"peft_config.nope": 1}', "has no field 'nope'"),
    ("run-0", 'clone {"learning_rate.x": 1}', "not a config object"),
    ("run-0", 'clone {"peft_config": {"r": 4}}', "candidate"),
    ("run-0", 'clone {"peft_config.r": "eight"}', "takes a number"),
    ("run-0", 'clone {"gradient_checkpointing": 1}', "takes true or false"),
    ("run-0", 'clone-warm {"learning_rate": 1e-4}', "has not finished a chunk"),
    ("run-0", 'clone {"reward_funcs": {"candidate": 0}}', "unknown knob 'reward_funcs'"),
    ("run-0", 'clone {"model": {"candidate": 0}}', "not a List knob"),
]


def test_a_clone_changes_no_experiment_wide_field():
    from trl_rapidfire.config.fields import CLONE_KEEPS

    for field in sorted(CLONE_KEEPS):
        with pytest.raises(OpError, match=f"'{field}' describes the whole experiment"):
            resolve_overrides({field: None}, {}, {}, {}, {})


@pytest.mark.parametrize("text", ["", "pause", "stop now", "clone {", "clone 3", None, 5])
def test_parse_op_rejects_malformed_text(text):
    with pytest.raises(OpError):
        parse_op(text)


def test_parse_op_reads_verbs_and_overrides():
    assert parse_op(" STOP ").verb == "stop"
    op = parse_op('clone-warm {"learning_rate": 1e-4, "peft_config.r": 16}')
    assert op.warm and dict(op.overrides) == {"learning_rate": 1e-4, "peft_config.r": 16}
    assert parse_op("clone").overrides == {}


def test_bad_ops_are_rejected_and_the_runs_finish_unchanged(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tiny_model_path()
    data = make_sft_dataset(32)

    def experiment(out):
        return RFSFTTrainer(
            model=path,
            args=RFSFTConfig(output_dir=str(out), num_chunks=2, max_steps=4,
                             learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                             **cpu_training_kwargs()),
            train_dataset=data,
            peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
        )

    rf = experiment(tmp_path / "bad")
    for run, text, _ in BAD_OPS:
        rf.engine.queue_op(run, text)
    with pytest.warns(RuntimeWarning):
        rf.train()
    results = [r.result for r in rf.op_log]
    assert len(results) == len(BAD_OPS) >= 20
    for (_run, text, fragment), result in zip(BAD_OPS, results):
        assert result.startswith("error: "), (text, result)
        assert fragment in result, (text, result)
    # A deleted run accepts nothing more, and a completed one cannot be stopped or resumed.
    rf.delete("run-1")
    rf.stop("run-1")
    rf.stop("run-0")
    rf.train()
    assert [r.result for r in rf.op_log[-3:]] == [
        "ok: deleted",
        "error: run-1 is deleted; no op applies to it",
        "error: run-0 is completed; only pending or running runs stop",
    ]
    assert {r.name: r.status for r in rf.runs} == {"run-0": RunStatus.COMPLETED,
                                                   "run-1": RunStatus.DELETED}
    assert len(rf.runs) == 2  # no clone was created by any bad op

    clean = experiment(tmp_path / "clean")
    clean.train()
    for run in ("run-0",):
        got = load_file(tmp_path / "bad" / "runs" / run / "final" / "adapter_model.safetensors")
        want = load_file(tmp_path / "clean" / "runs" / run / "final" /
                         "adapter_model.safetensors")
        assert all(torch.equal(got[k], want[k]) for k in want)
    got = load_file(tmp_path / "bad/runs/run-1/final/adapter_model.safetensors")
    want = load_file(tmp_path / "clean/runs/run-1/final/adapter_model.safetensors")
    assert all(torch.equal(got[k], want[k]) for k in want)
