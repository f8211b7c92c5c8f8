"""Issue 47, defect 8: grid search through Optuna's ``GridSampler`` (a sampler given as a
function of the seed): each grid point is proposed once, whatever the rotation's size, and the
search ends cleanly when the grid is covered; a grid over other parameters is refused before
anything loads, naming our own grid search."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from trl_rapidfire import List, Range, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.search.searches import SearchError
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

optuna = pytest.importorskip("optuna")

from trl_rapidfire.integrations.optuna.search import OptunaSearch  # noqa: E402
from trl_rapidfire.integrations.optuna.study import SAMPLER_DONE  # noqa: E402

BASE = dict(cpu_training_kwargs(), num_chunks=2, num_train_epochs=1,
            per_device_train_batch_size=4, eval_strategy="chunk", per_device_eval_batch_size=8,
            logging_steps=1, seed=5)
GRID = {"learning_rate": [1e-3, 3e-2], "lr_scheduler_type": ["linear", "constant"]}
POINTS = sorted((lr, s) for lr in GRID["learning_rate"] for s in GRID["lr_scheduler_type"])


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _grid(seed: int) -> optuna.samplers.GridSampler:
    return optuna.samplers.GridSampler(GRID, seed=seed)


def _trainer(out: Path, search: OptunaSearch) -> RFSFTTrainer:
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=Range(1e-5, 1e-1, log=True),
                         lr_scheduler_type=List(["linear", "cosine", "constant"]), **BASE),
        train_dataset=make_sft_dataset(12, seed=1),
        eval_dataset=make_sft_dataset(4, seed=9),
        peft_config=tiny_lora_config(r=4),
        search=search,
    )


def _proposed(out: Path) -> list[tuple[float, str]]:
    with open(out / "search.csv", newline="", encoding="utf-8") as f:
        rows = [json.loads(r["detail"]) for r in csv.DictReader(f) if r["event"] == "proposed"]
    return [(r["learning_rate"], r["lr_scheduler_type"]) for r in rows]


def test_a_grid_sampler_proposes_each_point_once_and_the_search_ends_cleanly(tmp_path):
    out = tmp_path / "exp"
    # More runs asked for than the grid has, and more at a time than it has points but one.
    rf = _trainer(out, OptunaSearch(_grid, num_runs=6, max_concurrent=3, seed=1))
    rf.train()  # before: Optuna's "Study.stop is supposed to be invoked inside an objective"
    assert sorted(_proposed(out)) == POINTS  # each point once (before: a reshuffle per trial)
    assert sorted((r.knobs["learning_rate"], r.knobs["lr_scheduler_type"])
                  for r in rf.runs) == POINTS
    assert all(r.status == RunStatus.COMPLETED for r in rf.runs)
    study = optuna.load_study(study_name="trl-rapidfire", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / ".rapidfire" / "optuna.journal"))))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 4
    assert study.user_attrs[SAMPLER_DONE] in range(4)  # the sampler said it was done
    # A re-run finds the grid done: it proposes nothing and trains nothing.
    again = _trainer(out, OptunaSearch(_grid, num_runs=6, max_concurrent=3, seed=1))
    again.train()
    assert sorted(_proposed(out)) == POINTS


def test_a_grid_larger_than_the_budget_proposes_distinct_points_the_same_on_a_rerun(tmp_path):
    search = OptunaSearch(_grid, num_runs=3, max_concurrent=1, seed=7)
    one, two = tmp_path / "one", tmp_path / "two"
    _trainer(one, search).train()
    _trainer(two, OptunaSearch(_grid, num_runs=3, max_concurrent=1, seed=7)).train()
    assert len(set(_proposed(one))) == 3 and set(_proposed(one)) <= set(POINTS)
    assert _proposed(two) == _proposed(one)  # one seed for the study: the same order


@pytest.mark.parametrize(("grid", "match"), [
    ({"learning_rate": [1e-3]}, r"GridSampler has the parameters \['learning_rate'\]; this "
                                r"search's are \['learning_rate', 'lr_scheduler_type'\]"),
    ({"learning_rate": [1e-3], "lr_scheduler_type": ["linear"], "seed": [1]}, "use our own "
                                                                              "grid search"),
    ({"learning_rate": [1.0], "lr_scheduler_type": ["linear"]}, r"gives 'learning_rate' the "
                                                                r"values \[1\.0\]"),
    ({"learning_rate": [1e-3], "lr_scheduler_type": ["cosine_with_restarts"]}, "List"),
])
def test_a_grid_over_other_parameters_is_refused_before_anything_loads(tmp_path, grid, match):
    search = OptunaSearch(lambda seed: optuna.samplers.GridSampler(grid, seed=seed),
                          num_runs=2)
    with pytest.raises(SearchError, match=match):
        RFSFTTrainer(model="/nonexistent/never-loaded",
                     args=RFSFTConfig(output_dir=str(tmp_path), learning_rate=Range(
                         1e-5, 1e-1, log=True), lr_scheduler_type=List(["linear", "cosine"]),
                         **BASE),
                     train_dataset=make_sft_dataset(12, seed=1),
                     eval_dataset=make_sft_dataset(4, seed=9), search=search)
