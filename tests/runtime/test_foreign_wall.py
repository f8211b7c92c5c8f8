"""The wall around Optuna's and MLflow's private names (runtime/foreign_optuna.py,
runtime/foreign_mlflow.py): every name it touches exists on the installed library's objects
(an upgrade that renames one fails here, by name, instead of silently falling back), the
installed versions are ones the wall was checked against, and the user's pruner is never
changed by training with it."""

from __future__ import annotations

import copy
import importlib.metadata
import pickle

import pytest

optuna = pytest.importorskip("optuna")

from trl_rapidfire.control.policies import RunHistory  # noqa: E402
from trl_rapidfire.integrations.optuna.pruning_study import resolve_auto  # noqa: E402
from trl_rapidfire.runtime.foreign_mlflow import (  # noqa: E402
    MLFLOW_CHECKED,
    MLFLOW_NAMES,
    latest_metrics,
)
from trl_rapidfire.runtime.foreign_optuna import (  # noqa: E402
    OPTUNA_CHECKED,
    OPTUNA_NAMES,
    grid_search_space,
    halving_rungs,
    with_resources,
)
from trl_rapidfire.shared_state.runs import RunStatus  # noqa: E402

P = optuna.pruners


def _optuna_instance(where: str):
    """An instance of the Optuna class at ``where`` (``"pruners.HyperbandPruner"``): the names
    are instance attributes, set by the constructor."""
    module, name = where.split(".")
    kind = getattr(getattr(optuna, module), name)
    return kind({"x": [1, 2]}) if name == "GridSampler" else kind()


@pytest.mark.parametrize("where", sorted(OPTUNA_NAMES))
def test_every_optuna_private_name_the_wall_touches_exists(where):
    instance = _optuna_instance(where)
    missing = [n for n in OPTUNA_NAMES[where] if not hasattr(instance, n)]
    assert not missing, (
        f"Optuna {optuna.__version__}'s {where} has no {missing}: runtime/foreign_optuna.py "
        "reads them; find where this Optuna keeps them and update the wall")


def test_every_mlflow_private_name_the_wall_reads_exists():
    from mlflow.entities import Metric, RunData

    data = RunData(metrics=[Metric("eval_loss", 0.5, 0, 7)])
    missing = [n for n in MLFLOW_NAMES["entities.RunData"] if not hasattr(data, n)]
    assert not missing, (
        f"MLflow {importlib.metadata.version('mlflow')}'s RunData has no {missing}: "
        "runtime/foreign_mlflow.py reads it; update the wall")


def test_the_installed_versions_are_the_ones_the_wall_was_checked_against():
    # A new version may keep the names and change what they mean: it is added to the wall's
    # list once the tests above and the pruner's and panel's tests pass with it.
    assert optuna.__version__ in OPTUNA_CHECKED, (optuna.__version__, OPTUNA_CHECKED)
    assert importlib.metadata.version("mlflow") in MLFLOW_CHECKED, MLFLOW_CHECKED


def test_what_the_wall_reads():
    from mlflow.entities import Metric, Run, RunData, RunInfo

    assert halving_rungs(P.SuccessiveHalvingPruner(min_resource=3, reduction_factor=2,
                                                   min_early_stopping_rate=1)) == (6, 2)
    assert halving_rungs(P.HyperbandPruner(min_resource=2, reduction_factor=3)) == (2, 3)
    assert halving_rungs(P.SuccessiveHalvingPruner()) == (None, 4)  # "auto", not set yet
    assert halving_rungs(P.MedianPruner()) is None
    assert grid_search_space(optuna.samplers.GridSampler({"b": [1, 2], "a": ["x"]})) == {
        "a": ["x"], "b": [1, 2]}
    info = RunInfo("r1", "e1", "u", "FINISHED", 0, 1, "active", run_name="run-0")
    run = Run(info, RunData(metrics=[Metric("eval_loss", 0.5, 0, 7)]))
    assert [(m.key, m.value, m.step) for m in latest_metrics(run)] == [("eval_loss", 0.5, 7)]


def _history(name, last):
    return RunHistory(name, RunStatus.RUNNING, 0, 2, (last // 2, last))


@pytest.mark.parametrize("make", [
    lambda: P.SuccessiveHalvingPruner(),  # min_resource "auto": set from the planned steps
    lambda: P.HyperbandPruner(),  # max_resource "auto"
], ids=["halving", "hyperband"])
def test_auto_resources_are_set_on_a_copy_never_on_the_users_pruner(make):
    # The old resolve_auto wrote _min_resource / _max_resource into the pruner it was given.
    users = make()
    before = pickle.dumps(users.__dict__)
    resolved = resolve_auto(users, [_history("run-0", 400), _history("run-1", 400)])
    assert resolved is not users
    assert pickle.dumps(users.__dict__) == before
    if type(users) is P.SuccessiveHalvingPruner:
        assert halving_rungs(resolved) == (4, 4)  # 1% of the last step, as Optuna estimates
    else:
        assert resolved._max_resource == 401  # what the wall set
    again = with_resources(users, 0)  # nothing planned yet: an unchanged copy
    assert again is not users and pickle.dumps(again.__dict__) == before


def test_training_leaves_the_users_pruner_as_it_was(tmp_path):
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.integrations.optuna.pruner import OptunaPruner
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    users = P.SuccessiveHalvingPruner(reduction_factor=2)  # min_resource "auto"
    before = copy.deepcopy(users.__dict__)
    policy = OptunaPruner(users)
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path), learning_rate=List([1e-5, 3e-2]),
                         num_chunks=4, eval_strategy="chunk",
                         **dict(cpu_training_kwargs(), per_device_train_batch_size=4,
                                per_device_eval_batch_size=8, num_train_epochs=1,
                                logging_steps=1)),
        train_dataset=make_sft_dataset(16, seed=1),  # 4 steps: one a chunk
        eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4),
        policy=policy,
    )
    rf.train()
    assert policy.stats["prune_calls"] > 0  # the pruner was asked
    assert users.__dict__ == before
    assert users._min_resource is None  # still "auto" in the user's object
