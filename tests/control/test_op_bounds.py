"""No op can freeze an experiment: a value that sizes a run's chunk plan (``num_train_epochs``,
``max_steps``, ``num_chunks``, and the epochs times the steps a dataset makes of them) is held
to limits that say what they are, before anything is built. Bomb clones among good ops, from
op files, tags and Python, are answered ``error:`` within seconds while the good ops apply and
every run finishes."""

from __future__ import annotations

import math
import time

import pytest

from trl_rapidfire import List, Range, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.config.plan_limits import (
    MAX_NUM_CHUNKS,
    MAX_PLAN_CHUNKS,
    MAX_TRAIN_EPOCHS,
    MAX_TRAIN_STEPS,
)
from trl_rapidfire.control.folder_control import Inbox
from trl_rapidfire.control.ops import OpError, parse_op, resolve_overrides
from trl_rapidfire.engine.chunks import ChunkPlanError, plan_chunks, training_steps
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.csv_logs import read_rows
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BOMBS = [
    ('clone {"num_train_epochs": 1e9}', "MAX_TRAIN_EPOCHS", f"{MAX_TRAIN_EPOCHS:,}"),
    ('clone {"max_steps": 1000000000000}', "MAX_TRAIN_STEPS", f"{MAX_TRAIN_STEPS:,}"),
    ('clone-warm {"num_train_epochs": 1e300}', "MAX_TRAIN_EPOCHS", f"{MAX_TRAIN_EPOCHS:,}"),
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize(("text", "constant", "limit"), BOMBS)
def test_every_sender_refuses_a_plan_bomb_naming_the_field_the_limit_and_the_fix(
        text, constant, limit):
    with pytest.raises(OpError) as raised:
        parse_op(text)
    message = str(raised.value)
    field = text.split('"')[1]
    assert f"`{field}`" in message and constant in message and limit in message
    assert "train fewer epochs" in message or "give a step count" in message
    # A Python op (never parsed: its sender has it as data) is held to the same limits
    # when it is applied.
    with pytest.raises(OpError, match=constant):
        resolve_overrides({field: 1e12}, {}, {}, {field: 1}, {})


def test_a_config_refuses_plan_sizing_values_before_trl_sees_them(tmp_path):
    common = dict(output_dir=str(tmp_path), **cpu_training_kwargs())
    cases = [
        (dict(num_train_epochs=1e9), "MAX_TRAIN_EPOCHS"),
        (dict(max_steps=10**12), "MAX_TRAIN_STEPS"),
        (dict(num_chunks=MAX_NUM_CHUNKS + 1), "MAX_NUM_CHUNKS"),
        (dict(num_train_epochs=List([1, 5e6])), "MAX_TRAIN_EPOCHS"),  # every candidate
        (dict(max_steps=Range(10, 10**10)), "MAX_TRAIN_STEPS"),  # a Range's bounds
    ]
    for kwargs, constant in cases:
        with pytest.raises(RFConfigError, match=constant) as raised:
            RFSFTConfig(**common, **kwargs)
        assert "trl_rapidfire.config.plan_limits" in str(raised.value)
    # At the limits themselves, a config is made.
    RFSFTConfig(**common, num_train_epochs=MAX_TRAIN_EPOCHS, num_chunks=MAX_NUM_CHUNKS)
    RFSFTConfig(**common, max_steps=MAX_TRAIN_STEPS)


def test_a_plan_is_counted_before_it_is_built():
    started = time.perf_counter()
    with pytest.raises(ChunkPlanError, match="MAX_PLAN_CHUNKS"):
        plan_chunks(1, MAX_PLAN_CHUNKS + 1, 1)  # one chunk a step: one chunk too many
    with pytest.raises(ChunkPlanError, match="MAX_PLAN_CHUNKS"):
        plan_chunks(8, 8 * MAX_PLAN_CHUNKS, 2)  # epochs times chunks an epoch
    with pytest.raises(ChunkPlanError, match="MAX_TRAIN_STEPS"):
        plan_chunks(10**12, 10**12, 4)  # few chunks, but no run takes that many steps
    with pytest.raises(ChunkPlanError, match="MAX_NUM_CHUNKS"):
        plan_chunks(10**9, 10, 10**9)  # a short run, but an epoch cut 10**9 times
    with pytest.raises(ChunkPlanError, match="finite"):
        training_steps(8, 1, math.inf)
    assert time.perf_counter() - started < 1
    assert len(plan_chunks(1, MAX_PLAN_CHUNKS, 1)) == MAX_PLAN_CHUNKS  # the limit itself


def test_bomb_ops_among_good_ones_are_answered_while_the_experiment_trains_on(tmp_path):
    out = tmp_path / "out"
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        # 16 rows, 4 a batch: 4 steps an epoch, in 2 chunks.
        args=RFSFTConfig(output_dir=str(out), num_chunks=2, num_train_epochs=1,
                         learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                         **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
    )
    # From the CLI (op files), a run tag, and the script, bombs first and among good ops.
    inbox = Inbox(Layout(out))
    inbox.post("run-0", BOMBS[0][0])
    inbox.post("run-0", 'clone {"learning_rate": 0.002}')
    trainer.engine.queue_op("run-1", BOMBS[1][0], source="tag")
    # Under every limit a field has, but 60,000 epochs of 2 chunks: the plan's own limit.
    trainer.clone("run-1", {"num_train_epochs": 60000})
    trainer.clone("run-1", {"learning_rate": 5e-4})
    started = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="MAX_PLAN_CHUNKS"):
        trainer.train(blocking=False)
        trainer.wait(timeout=120)
    assert time.perf_counter() - started < 120
    answers = {r.op: r.result for r in trainer.op_log}
    assert len(answers) == 5
    assert answers[BOMBS[0][0]].startswith("error: `num_train_epochs`=1e+09 is over")
    assert answers[BOMBS[1][0]].startswith("error: `max_steps`=1,000,000,000,000 is over")
    assert "MAX_PLAN_CHUNKS" in answers['clone {"num_train_epochs": 60000}']
    assert answers['clone {"learning_rate": 0.002}'].startswith("ok: created run-")
    assert answers['clone {"learning_rate": 0.0005}'].startswith("ok: created run-")
    # The good clones trained, and so did the runs; nothing of a refused clone is left.
    assert {r.name: r.status for r in trainer.runs} == {
        f"run-{i}": RunStatus.COMPLETED for i in range(4)}
    assert sorted(p.name for p in (out / "runs").iterdir()) == [f"run-{i}" for i in range(4)]
    # Every op was answered once, so a re-run does not meet a bomb again.
    assert not inbox.waiting()
    assert [row["result"] for row in read_rows(out / "ops.csv")] == [
        r.result for r in trainer.op_log]
