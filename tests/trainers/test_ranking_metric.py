"""One ranking metric for a real experiment: the trainer chooses it once (the policy's metric
before ``metric_for_best_model``), ``best_run`` picks by it, it is recorded in the
experiment's folder and on each MLflow run, and ``trl-rapidfire status`` and ``report`` read
it from there (best first, ``--sort``, ``--top``); a re-run whose policy ranks by another
metric records that one. Tiny model, real sqlite MLflow store."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer, SuccessiveHalving
from trl_rapidfire.cli import main
from trl_rapidfire.reports.ranking import RANKING_TAG, RankingMetric, read_ranking
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

pytestmark = pytest.mark.slow  # two tiny experiments: ~20 s on a busy 2-core machine

LRS = [1e-4, 3e-3, 1e-2]
# A policy that judges by eval_loss, higher first (so its ranking cannot be metric_for_best_
# model's, lower first), and never acts: its first rung is past the last chunk.
NEVER = {"metric": "eval_loss", "mode": "max", "min_chunks": 8}


def _trainer(out, *, policy, report_to="mlflow"):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(LRS), num_chunks=2,
                         max_steps=4, per_device_train_batch_size=4, logging_steps=1,
                         eval_strategy="chunk", per_device_eval_batch_size=8,
                         metric_for_best_model="eval_loss",
                         **{**cpu_training_kwargs(), "report_to": report_to}),
        train_dataset=make_sft_dataset(16, seed=1), eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4), policy=policy)


def _rows(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    return [line.split()[0] for line in lines[start + 2:] if line.startswith("run-")]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("ranking")
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        mp.setenv("HF_HUB_OFFLINE", "1")
        trainer = _trainer(root / "exp", policy=SuccessiveHalving(**NEVER))
        trainer.train()
        trainer.engine.tracker.flush()
        yield root, trainer


def test_the_trainer_ranks_by_its_policys_metric_and_records_it(tracked):
    root, trainer = tracked
    want = RankingMetric("eval_loss", True, "policy", "SuccessiveHalving")
    assert trainer.ranking == want
    evals = {r.name: r.metrics["eval_loss"] for r in trainer.runs}
    assert trainer.best_run.name == max(evals, key=evals.get)  # not metric_for_best_model's
    assert read_ranking(root / "exp") == want
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`rapidfire.role` = 'run'")
    assert len(runs) == len(LRS)
    assert {RankingMetric.from_text(r.data.tags[RANKING_TAG]) for r in runs} == {want}


def test_status_lists_the_runs_best_first_and_sorts_and_cuts_when_asked(tracked, monkeypatch,
                                                                        capsys):
    root, trainer = tracked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    evals = {r.name: r.metrics["eval_loss"] for r in trainer.runs}
    losses = {r.name: r.metrics["loss"] for r in trainer.runs}
    assert main(["status", str(root / "exp")]) == 0
    out = capsys.readouterr().out
    assert _rows(out) == sorted(evals, key=evals.get, reverse=True)
    assert "best first by eval_loss (higher is better; SuccessiveHalving's metric)" in out
    assert main(["status", str(root / "exp"), "--sort", "loss", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert _rows(out) == sorted(losses, key=losses.get)[:2]
    assert "1 more run(s) not shown (--top 2)" in out
    assert main(["status", str(root / "exp"), "--sort", "run"]) == 0
    assert _rows(capsys.readouterr().out) == ["run-0", "run-1", "run-2"]
    assert main(["status", str(root / "exp"), "--sort", "accuracy"]) == 2
    assert "no run logged that metric" in capsys.readouterr().err


def test_the_report_ranks_by_the_experiments_metric(tracked, tmp_path, monkeypatch):
    root, trainer = tracked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    assert main(["report", str(root / "exp"), "--out", str(tmp_path / "report")]) == 0
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "- ranked by: `eval_loss` (latest value, max is best)" in summary
    rows = [line.split("|")[2].strip() for line in summary.splitlines()
            if line.startswith("| 1 ") or line.startswith("| 2 ") or line.startswith("| 3 ")]
    evals = {r.name: r.metrics["eval_loss"] for r in trainer.runs}
    assert rows == sorted(evals, key=evals.get, reverse=True)


def test_a_rerun_whose_policy_ranks_otherwise_records_the_new_metric(tracked, monkeypatch):
    root, _trainer_before = tracked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = _trainer(root / "exp", policy=None)  # metric_for_best_model, lower is better
    again.train()
    again.engine.tracker.flush()
    want = RankingMetric("eval_loss", False, "metric_for_best_model")
    assert again.ranking == want and read_ranking(root / "exp") == want
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`rapidfire.role` = 'run'")
    assert {json.loads(r.data.tags[RANKING_TAG])["mode"] for r in runs} == {"min"}


def test_status_of_an_untracked_folder_is_best_first_too(tmp_path, capsys, monkeypatch):
    import torch

    torch.set_num_threads(1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'none.db'}")
    trainer = _trainer(tmp_path / "exp", policy=None, report_to="none")
    trainer.train()
    evals = {r.name: r.metrics["eval_loss"] for r in trainer.runs}
    assert main(["status", "--dir", str(tmp_path / "exp"), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "not tracked in MLflow" in out and "eval_loss" in out.split("\n")[2]
    assert _rows(out) == sorted(evals, key=evals.get)[:2]
