"""The new kinds judged by their own metrics: a policy stops Reward runs by ``eval_accuracy``
(higher is better), and an Optuna search proposes RLOO runs by their ``reward``."""

from __future__ import annotations

import pytest
from trainer_kinds import KINDS

from trl_rapidfire import List, Range, SuccessiveHalving
from trl_rapidfire.cli import main
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import make_reward_dataset


def test_successive_halving_keeps_the_reward_models_ranking_pairs_best(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = KINDS["reward"]
    common = {k: v for k, v in spec.common.items() if k not in ("learning_rate", "report_to")}
    trainer = spec.rf_trainer(
        model=_model(),
        **{**spec.shared, "train_dataset": make_reward_dataset(64),
           "eval_dataset": make_reward_dataset(32, seed=1)},
        args=spec.rf_config(output_dir=str(tmp_path / "exp"), num_chunks=4,
                            eval_strategy="policy", report_to="mlflow",
                            learning_rate=List([1e-4, 1e-3, 1e-2, 3e-2]),
                            metric_for_best_model="eval_accuracy", greater_is_better=True,
                            **common),
        policy=SuccessiveHalving("eval_accuracy", mode="max", eta=2))
    trainer.train()
    runs = {r.name: r for r in trainer.runs}
    stopped = [r for r in runs.values() if r.status == RunStatus.STOPPED]
    assert len(stopped) == 3 and all("eval_accuracy" in r.last_op for r in stopped)
    # At the first rung (step 4) the two kept runs are the two most accurate.
    first = {name: dict(trainer.metric_history(name, "eval_accuracy"))[4] for name in runs}
    kept = [n for n, r in runs.items() if r.global_step > 4]
    assert len(kept) == 2
    assert min(first[n] for n in kept) >= max(first[n] for n in runs if n not in kept)
    best = trainer.best_run
    assert best.status == RunStatus.COMPLETED
    assert best.metrics["eval_accuracy"] == max(
        r.metrics["eval_accuracy"] for r in runs.values() if r.status == RunStatus.COMPLETED)
    # The status table shows what the runs were judged by, beside the losses.
    capsys.readouterr()
    assert main(["status", "--output-dir", str(tmp_path / "exp")]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Ranked by the policy's metric, higher first: the line above the table says so.
    at_header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    assert "eval_accuracy" in lines[at_header - 1] and "higher" in lines[at_header - 1]
    header = lines[at_header].split()
    assert header[:6] == ["run", "status", "progress", "loss", "eval_loss", "eval_accuracy"]
    at = lines[at_header].index("eval_accuracy")  # the column's start in every row
    rows = [line for line in lines[at_header + 1:] if line.startswith("run-")]
    shown = {line.split()[0]: line[at:].split()[0] for line in rows}
    # Best first by the metric (a run stopped at its rung included, at its value then).
    order = [line.split()[0] for line in rows]
    assert order == sorted(runs, key=lambda n: -runs[n].metrics["eval_accuracy"])
    assert shown == {name: f"{r.metrics['eval_accuracy']:.4g}" for name, r in runs.items()}


def test_an_optuna_search_proposes_rloo_runs_by_their_reward(tmp_path):
    optuna = pytest.importorskip("optuna")
    from trl_rapidfire import OptunaSearch

    spec = KINDS["rloo"]
    trainer = spec.experiment(
        tmp_path, num_chunks=2, learning_rate=Range(1e-4, 1e-2, log=True),
        trainer={"search": OptunaSearch(num_runs=3, max_concurrent=2, metric="reward",
                                        direction="maximize", seed=1)})
    trainer.train()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(tmp_path / ".rapidfire" / "optuna.journal")))
    trials = optuna.load_study(study_name="trl-rapidfire", storage=storage).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    for trial, run in zip(trials, sorted(trainer.runs, key=lambda r: r.name)):
        assert run.status == RunStatus.COMPLETED
        assert trial.params["learning_rate"] == run.knobs["learning_rate"]
        assert trial.value == run.metrics["reward"]


def _model():
    from trl_rapidfire.testing import tiny_model_path

    return tiny_model_path()
