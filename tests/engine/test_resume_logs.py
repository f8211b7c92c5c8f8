"""A run continued from its checkpoint after a kill logs what the uninterrupted run logs.

Each experiment: 2 runs, 16 steps each in 4 chunks (boundaries at steps 4, 8 and 12), a
checkpoint at every boundary, and logging every 5 steps, so no boundary is a logging step: the
loss, token counts and TRL's averaged metrics of the steps since the last log cross the
checkpoint. The first session dies (KeyboardInterrupt, a second Ctrl-C) in the middle of
run-1's third chunk; a re-run of the same script continues both runs from their last
boundary checkpoints. Every value each run logged (its ``trainer_state.json``, what MLflow
gets) must equal the uninterrupted experiment's, but for the wall-clock ones below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from trl_rapidfire import (
    List,
    RFDPOConfig,
    RFDPOTrainer,
    RFGRPOConfig,
    RFGRPOTrainer,
    RFSFTConfig,
    RFSFTTrainer,
)
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_dpo_dataset,
    make_grpo_dataset,
    make_sft_dataset,
    reward_correct_answer,
    tiny_lora_config,
    tiny_model_path,
)

# Measured on the clock of the process that trained, not values of the run: a continued run's
# train() started in the re-run, so its runtime and the rates over it are the re-run's.
WALL_CLOCK = {"train_runtime", "train_samples_per_second", "train_steps_per_second",
              "train_tokens_per_second", "step_time"}

COMMON = dict(cpu_training_kwargs(), per_device_train_batch_size=4, num_chunks=4,
              num_train_epochs=1, logging_steps=5, seed=3, checkpoint_every="chunk")


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


class HardInterrupt(TrainerCallback):
    """A second Ctrl-C: KeyboardInterrupt as run-1 begins ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if args.output_dir.endswith("run-1") and state.global_step == self.step:
            raise KeyboardInterrupt


def _sft(out: Path) -> RFSFTTrainer:
    # Tracked to MLflow too (its store is the test's: see _offline).
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]),
                         **{**COMMON, "report_to": "mlflow"}),
        train_dataset=make_sft_dataset(64, seed=1),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
    )


def _dpo(out: Path) -> RFDPOTrainer:
    return RFDPOTrainer(
        model=tiny_model_path(),
        args=RFDPOConfig(output_dir=str(out), beta=List([0.1, 0.5]), learning_rate=1e-3,
                         **COMMON),
        train_dataset=make_dpo_dataset(64, seed=1),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
    )


def _grpo(out: Path) -> RFGRPOTrainer:
    # One prompt a step (4 completions of it), a generation every 2 steps: chunk boundaries
    # (4, 8, 12) fall on whole generation cycles, as RF plans them.
    return RFGRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=[reward_correct_answer],
        args=RFGRPOConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]),
                          num_generations=4, max_completion_length=8, steps_per_generation=2,
                          beta=0.04, **COMMON),
        train_dataset=make_grpo_dataset(16, seed=1),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
    )


def _logs(out: Path, run: str) -> list[dict]:
    state = json.loads((out / "runs" / run / "final" / "trainer_state.json").read_text())
    return [{k: v for k, v in entry.items() if k not in WALL_CLOCK}
            for entry in state["log_history"]]


def _train_output(out: Path, run: str) -> tuple:
    saved = json.loads((out / "runs" / run / "final" / "train_output.json").read_text())
    metrics = {k: v for k, v in saved["metrics"].items() if k not in WALL_CLOCK}
    return saved["global_step"], saved["training_loss"], metrics


def _tracked(trainer) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every point each run of ``trainer``'s experiment has in MLflow: by run, by key (the
    wall-clock keys aside), (step, value) in step order."""
    from mlflow import MlflowClient

    tracker = trainer.engine.tracker
    tracker.flush()
    client = MlflowClient(tracker.uri)
    found = {}
    for run in client.search_runs([tracker.experiment_id],
                                  filter_string="tags.`rapidfire.role` = 'run'"):
        found[run.data.tags["rapidfire.run"]] = {
            key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id,
                                                                              key))
            for key in run.data.metrics if key not in WALL_CLOCK}
    return found


def _weights(out: Path, run: str) -> dict[str, torch.Tensor]:
    return load_file(out / "runs" / run / "final" / "adapter_model.safetensors")


def _assert_same_runs(reference: Path, out: Path) -> None:
    for run in ("run-0", "run-1"):
        want, got = _weights(reference, run), _weights(out, run)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        expected = _logs(reference, run)
        assert [e["step"] for e in expected] == [5, 10, 15, 16]  # the last: train_loss
        assert "train_loss" in expected[-1]
        assert _logs(out, run) == expected, run
        assert _train_output(out, run) == _train_output(reference, run), run


@pytest.mark.parametrize("make", [_sft, _dpo, _grpo], ids=["sft", "dpo", "grpo"])
def test_a_killed_and_rerun_experiment_logs_what_the_uninterrupted_one_logs(tmp_path, make):
    reference = make(tmp_path / "ref")
    reference.train()

    out = tmp_path / "exp"
    first = make(out)
    first.run_trainer("run-1").add_callback(HardInterrupt(10))  # its third chunk: 8-12
    with pytest.raises(KeyboardInterrupt):
        first.train()
    checkpoints = out / ".rapidfire" / "checkpoints"
    # Each continues from a boundary that is not a logging step (5, 10, 15): run-1 from 8,
    # run-0 (left at its boundary 12 as the worker stopped) from 12.
    assert (checkpoints / "run-1" / "checkpoint-8").is_dir()
    assert (checkpoints / "run-0" / "checkpoint-12").is_dir()
    second = make(out)
    second.train()

    _assert_same_runs(tmp_path / "ref", out)
    if make is _sft:  # tracked to MLflow: what it has of each run is the same
        assert list(second.args.report_to) == ["mlflow"]
        expected = _tracked(reference)
        assert set(expected) == {"run-0", "run-1"}
        assert {"loss", "num_tokens", "mean_token_accuracy", "train_loss"} <= \
            set(expected["run-1"])
        assert _tracked(second) == expected


def test_a_run_interrupted_twice_logs_as_if_never_interrupted(tmp_path):
    # The second session's checkpoints carry the logs it continued: run-1 resumes from 8, its
    # boundary 12 is written by that session, which dies in run-1's last chunk (12-16); the
    # third continues from 12, its train_loss still over all 16 steps.
    reference = _sft(tmp_path / "ref")
    reference.train()
    out = tmp_path / "exp"
    twelve = out / ".rapidfire" / "checkpoints" / "run-1" / "checkpoint-12"
    for step in (10, 14):
        session = _sft(out)
        session.run_trainer("run-1").add_callback(HardInterrupt(step))
        with pytest.raises(KeyboardInterrupt):
            session.train()
        assert twelve.is_dir() == (step == 14)
    _sft(out).train()
    _assert_same_runs(tmp_path / "ref", out)
