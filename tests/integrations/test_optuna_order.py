"""OptunaSearch(order="promote") on a real experiment: a new run trains its first chunk at once,
then the most advanced run trains on (the runs waiting after their first chunk served oldest
first), as the schedule shows chunk by chunk; each run still ends bitwise as plain TRL trains
its config alone. The rule itself, and the claim queue's agreement with it, are tested in
tests/shared_state."""

from __future__ import annotations

import pytest
from plain_sft import assert_each_run_is_plain_sft

from trl_rapidfire import List, Range, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.storage.layout import run_index
from trl_rapidfire.storage.schedule import read_schedule_csv
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

optuna = pytest.importorskip("optuna")

from trl_rapidfire.integrations.optuna.search import OptunaSearch  # noqa: E402

CHUNKS = 3
BASE = dict(cpu_training_kwargs(), num_chunks=CHUNKS, num_train_epochs=1,
            per_device_train_batch_size=4, eval_strategy="chunk", per_device_eval_batch_size=8,
            logging_steps=1, seed=5)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _choices_follow_promote(records) -> int:
    """Replays the schedule: each chunk after a run's first is the most advanced unfinished
    run's (ties: the oldest run). Returns how many of those chunks had another run to choose
    (so that the check cannot pass for want of choices)."""
    done: dict[str, int] = {}
    choices = 0
    for record in records:
        if record.number > 0:
            waiting = {r: n for r, n in done.items() if n < CHUNKS}
            leader = min(waiting, key=lambda r: (-waiting[r], run_index(r)))
            assert record.run == leader, (record, waiting)
            choices += len(waiting) > 1
        else:
            assert record.run not in done  # a first chunk, once
        done[record.run] = record.number + 1
    return choices


def test_promote_trains_the_leader_on_and_each_run_is_plain_trl_bitwise(tmp_path):
    out = tmp_path / "exp"
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=Range(1e-5, 1e-1, log=True),
                         lr_scheduler_type=List(["linear", "cosine", "constant"]), **BASE),
        train_dataset=make_sft_dataset(24, seed=1), eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4),
        search=OptunaSearch(num_runs=5, max_concurrent=3, seed=3, order="promote"),
    )
    rf.train()

    records = read_schedule_csv(out / "schedule.csv")
    assert len(records) == 5 * CHUNKS
    assert _choices_follow_promote(records) >= 4
    # The first three runs each trained their first chunk before any run its second.
    assert [r.number for r in records[:4]] == [0, 0, 0, 1]

    config = {k: v for k, v in BASE.items() if k != "num_chunks"} | {"eval_strategy": "no"}
    assert_each_run_is_plain_sft(rf, out, tmp_path / "plain", config, rows=24)


def test_the_default_order_interleaves_where_promote_would_not(tmp_path):
    """The replay above tells the orders apart: the default's schedule fails it."""
    out = tmp_path / "exp"
    RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 1e-2, 1e-1]), **BASE),
        train_dataset=make_sft_dataset(24, seed=1), peft_config=tiny_lora_config(r=4),
        eval_dataset=make_sft_dataset(8, seed=9),
        search=OptunaSearch(num_runs=3, max_concurrent=3, seed=3),
    ).train()
    with pytest.raises(AssertionError):
        _choices_follow_promote(read_schedule_csv(out / "schedule.csv"))
