"""``eval_strategy="policy"`` with Optuna's successive-halving and Hyperband pruners: a run is
evaluated at the chunk ends that pass a rung step and at its last one; the pruner decides as
it does with a value at every chunk end. Other pruners read every step: every chunk end."""

from __future__ import annotations

import pytest

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.control.policies import Context, RunHistory
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

optuna = pytest.importorskip("optuna")

from trl_rapidfire.integrations.optuna.pruner import OptunaPruner  # noqa: E402


def _seen(pruner, ends):
    """Let the pruner see a context holding ``run-0`` with these chunk ends."""
    history = RunHistory("run-0", RunStatus.RUNNING, 0, len(ends), tuple(ends))
    pruner.on_chunk_end("run-0", Context({"run-0": history}))
    return [c for c in range(1, len(ends) + 1)
            if pruner.evaluates_at("run-0", c, len(ends))]


def test_where_the_halving_pruners_read():
    halving = optuna.pruners.SuccessiveHalvingPruner
    # Rungs at steps 2, 4, 8, 16: chunks of 2 steps pass them at chunks 1, 2, 4, 8.
    assert _seen(OptunaPruner(halving(min_resource=2, reduction_factor=2)),
                 range(2, 34, 2)) == [1, 2, 4, 8, 16]
    # Chunks of 3 steps: the chunk that passes each rung step (3, 6, 9, 18) and the last.
    assert _seen(OptunaPruner(halving(min_resource=2, reduction_factor=2)),
                 range(3, 25, 3)) == [1, 2, 3, 6, 8]
    # An early-stopping rate moves the first rung: 2 * 2**1 = 4, then 8, 16.
    assert _seen(OptunaPruner(halving(min_resource=2, reduction_factor=2,
                                      min_early_stopping_rate=1)),
                 range(2, 34, 2)) == [2, 4, 8, 16]
    # Hyperband's brackets start at every power: the same steps as its bracket 0.
    assert _seen(OptunaPruner(optuna.pruners.HyperbandPruner(min_resource=1, max_resource=27,
                                                             reduction_factor=3)),
                 range(1, 28)) == [1, 3, 9, 27]
    # The median pruner compares every step; an unknown run is evaluated too.
    median = OptunaPruner(optuna.pruners.MedianPruner())
    assert _seen(median, range(2, 10, 2)) == [1, 2, 3, 4]
    assert OptunaPruner(halving(min_resource=2)).evaluates_at("run-9", 3, 8)


def _experiment(out, eval_strategy):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-5, 1e-3, 1e-2, 3e-2]),
                         num_chunks=8, eval_strategy=eval_strategy,
                         **dict(cpu_training_kwargs(), per_device_train_batch_size=4,
                                per_device_eval_batch_size=8, num_train_epochs=1,
                                logging_steps=1)),
        train_dataset=make_sft_dataset(32, seed=1),  # 8 steps: one a chunk
        eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4),
        policy=OptunaPruner(optuna.pruners.SuccessiveHalvingPruner(min_resource=1,
                                                                   reduction_factor=2)),
    )


def _evaluations(rf):
    return sum(sum("eval_loss" in e for e in rf.run_trainer(r.name).state.log_history)
               for r in rf.runs)


def test_policy_cadence_prunes_as_every_chunk_does_with_fewer_evaluations(tmp_path):
    lean = _experiment(tmp_path / "policy", "policy")
    lean.train()
    full = _experiment(tmp_path / "chunk", "chunk")
    full.train()
    assert [(o.run, o.result) for o in lean.op_log] == [(o.run, o.result) for o in full.op_log]
    assert any(o.result.startswith("ok") for o in lean.op_log)  # something was pruned
    assert {r.name: r.status for r in lean.runs} == {r.name: r.status for r in full.runs}
    assert lean.best_run.metrics["eval_loss"] == full.best_run.metrics["eval_loss"]
    assert _evaluations(full) == len(full.schedule)
    assert _evaluations(lean) < _evaluations(full)
