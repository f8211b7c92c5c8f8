"""An Optuna search's journal (``.rapidfire/optuna.journal``) that is damaged, emptied or edited
between two sessions is named as such (the file, what is wrong, what to do) when the
experiment is continued, before anything trains: never Optuna's bare ``AssertionError``, never
a new study quietly started, never a param someone wrote in taken."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trl_rapidfire import List, Range, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

optuna = pytest.importorskip("optuna")

from trl_rapidfire.integrations.optuna.search import OptunaSearch  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _trainer(out: Path, runs: int) -> RFSFTTrainer:
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=Range(1e-5, 1e-1, log=True),
                         lr_scheduler_type=List(["linear", "constant"]), num_chunks=2,
                         max_steps=2, per_device_train_batch_size=4, seed=5,
                         **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(8, seed=1), peft_config=tiny_lora_config(r=4),
        search=OptunaSearch(num_runs=runs, max_concurrent=2, seed=3, metric="loss"))


def _lines(journal: Path) -> list[dict]:
    return [json.loads(line) for line in journal.read_text().splitlines()]


def _write(journal: Path, lines: list[dict]) -> None:
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _unknown_op(journal: Path) -> None:
    _write(journal, [*_lines(journal), {"op_code": 999, "worker_id": "x"}])


def _emptied(journal: Path) -> None:
    journal.write_text("")


def _deleted(journal: Path) -> None:
    journal.unlink()


def _param_edited(journal: Path) -> None:
    lines = _lines(journal)
    for line in lines:  # SET_TRIAL_PARAM of trial 0's learning rate
        if line["op_code"] == 5 and line["param_name"] == "learning_rate":
            line["param_value_internal"] = 1e9
            break
    _write(journal, lines)


def _trial_injected(journal: Path) -> None:
    """A trial enqueued with lr = 1e9: Optuna would give it to the next run asked for."""
    study = optuna.load_study(study_name="trl-rapidfire", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))))
    study.enqueue_trial({"learning_rate": 1e9, "lr_scheduler_type": "linear"})


DAMAGE = {"unknown op_code": (_unknown_op, "is damaged: a line has op_code 999"),
          "emptied": (_emptied, "was emptied or cut"),
          "deleted": (_deleted, "was emptied or cut"),
          "a param edited": (_param_edited, "was edited: trial 0"),
          "a trial injected": (_trial_injected, "was edited: trial 2 (waiting)")}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_emptied_or_edited_journal_is_named_before_anything_trains(tmp_path, damage):
    out = tmp_path / "exp"
    _trainer(out, runs=2).train()
    journal = out / ".rapidfire" / "optuna.journal"
    edit, said = DAMAGE[damage]
    edit(journal)
    schedule = (out / "schedule.csv").read_bytes()
    with pytest.raises(Exception) as raised:
        _trainer(out, runs=3).train()  # one run more: the sampler is asked again
    message = str(raised.value)
    assert str(journal) in message and said in message, message
    assert "restore the file" in message
    assert not isinstance(raised.value, AssertionError)
    assert (out / "schedule.csv").read_bytes() == schedule  # nothing trained
    assert not (out / "runs" / "run-2").exists()
