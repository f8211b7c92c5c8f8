"""``eval_strategy="policy"``: a run is evaluated where its policy reads the metric and at its
last chunk, nowhere else; the decisions, the winner and the weights are those of evaluating at
every chunk end (``"chunk"``), and the weights are plain TRL's."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from trl import SFTConfig, SFTTrainer

from trl_rapidfire import (
    Budget,
    List,
    PopulationBased,
    RFSFTConfig,
    RFSFTTrainer,
    SuccessiveHalving,
)
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.control.policies import Policies
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

LRS = [1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2]
CHUNKS = 8
BASE = dict(cpu_training_kwargs(), per_device_train_batch_size=4, per_device_eval_batch_size=8,
            num_train_epochs=1, logging_steps=1)
# Dropout: a random stream moved by an evaluation would show in the weights.
LORA = tiny_lora_config(r=4, lora_dropout=0.1)


def _experiment(out, eval_strategy, policy, lrs=LRS):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(list(lrs)), num_chunks=CHUNKS,
                         eval_strategy=eval_strategy, **BASE),
        train_dataset=make_sft_dataset(32, seed=1),  # 8 steps: one a chunk
        eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=LORA, policy=policy,
    )


def _eval_chunks(rf, name):
    """The chunk numbers (1-based) after which ``name`` logged an eval loss."""
    slot = rf.engine.slots[name]
    ends = {c.end_step: i + 1 for i, c in enumerate(slot.plan.chunks)}
    return [ends[e["step"]] for e in slot.live_trainer().state.log_history if "eval_loss" in e]


def _chunks_trained(rf):
    counts: dict[str, int] = {}
    for record in rf.schedule:
        counts[record.run] = counts.get(record.run, 0) + 1
    return counts


def _adapter(folder):
    return load_file(folder / "adapter_model.safetensors")


def test_successive_halving_evaluates_at_its_rungs_only_and_decides_as_with_every_chunk(
        tmp_path):
    lean = _experiment(tmp_path / "policy", "policy", SuccessiveHalving("eval_loss", eta=2))
    lean.train()
    full = _experiment(tmp_path / "chunk", "chunk", SuccessiveHalving("eval_loss", eta=2))
    full.train()

    trained = _chunks_trained(lean)
    rungs = [1, 2, 4]  # 8 chunks: rungs at 1, 2, 4 (the last chunk is no rung)
    evaluations = 0
    for run in lean.runs:
        want = [c for c in rungs if c <= trained[run.name]]
        if run.status == RunStatus.COMPLETED:
            want.append(CHUNKS)
        assert _eval_chunks(lean, run.name) == want, run.name
        evaluations += len(want)
    # Counted: far fewer evaluations than one per chunk trained...
    assert evaluations < len(lean.schedule)
    assert sum(len(_eval_chunks(full, r.name)) for r in full.runs) == len(full.schedule)
    # ...and nothing else changed: the same runs stopped at the same rungs, the same
    # survivor with the same final eval loss, the same training logs.
    assert [(o.run, o.result) for o in lean.op_log] == [(o.run, o.result) for o in full.op_log]
    assert {r.name: r.status for r in lean.runs} == {r.name: r.status for r in full.runs}
    assert lean.best_run.name == full.best_run.name
    assert lean.best_run.metrics["eval_loss"] == full.best_run.metrics["eval_loss"]
    for run in lean.runs:
        a = [e for e in lean.run_trainer(run.name).state.log_history if "loss" in e]
        b = [e for e in full.run_trainer(run.name).state.log_history if "loss" in e]
        assert a == b, run.name

    # The survivor's weights are plain TRL's for its config, bitwise.
    best = lean.best_run
    ref = SFTTrainer(model=tiny_model_path(), train_dataset=make_sft_dataset(32, seed=1),
                     peft_config=LORA,
                     args=SFTConfig(output_dir=str(tmp_path / "ref"),
                                    learning_rate=best.knobs["learning_rate"], **BASE))
    ref.train()
    ref.save_model()
    got = _adapter(tmp_path / "policy" / "runs" / best.name / "final")
    want = _adapter(tmp_path / "ref")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_without_a_reading_policy_a_run_is_evaluated_at_its_end_only(tmp_path):
    # Budget reads no metric; without any policy it is the same.
    for i, policy in enumerate([None, Budget(max_total_steps=10_000)]):
        rf = _experiment(tmp_path / f"e{i}", "policy", policy, lrs=[1e-3, 1e-2])
        rf.train()
        for run in rf.runs:
            assert _eval_chunks(rf, run.name) == [CHUNKS]
        assert "eval_loss" in rf.best_run.metrics


def test_where_each_policy_reads():
    sh = SuccessiveHalving(eta=3, min_chunks=2)
    assert [c for c in range(1, 40) if sh.evaluates_at("run-0", c, 40)] == [2, 6, 18]
    assert not sh.evaluates_at("run-0", 18, 18)  # a run's last chunk is no rung
    pbt = PopulationBased(interval_chunks=3, mutations={"learning_rate": 2.0})
    assert [c for c in range(1, 10) if pbt.evaluates_at("run-0", c, 10)] == [3, 6, 9]
    budget = Budget(max_total_steps=5)
    assert not any(budget.evaluates_at("run-0", c, 8) for c in range(1, 9))
    both = Policies([budget, sh])
    assert [c for c in range(1, 40) if both.evaluates_at("run-0", c, 40)] == [2, 6, 18]


def test_policy_cadence_needs_an_eval_dataset(tmp_path):
    with pytest.raises(RFConfigError, match="eval_strategy='policy'.*eval_dataset"):
        RFSFTTrainer(model="/nonexistent/model", train_dataset=make_sft_dataset(8),
                     args=RFSFTConfig(output_dir=str(tmp_path), eval_strategy="policy", **BASE),
                     policy=SuccessiveHalving())


def test_a_policy_on_an_eval_metric_without_evaluation_suggests_the_policy_cadence(tmp_path):
    with pytest.raises(RFConfigError, match="eval_strategy='policy'"):
        RFSFTTrainer(model="/nonexistent/model", train_dataset=make_sft_dataset(8),
                     eval_dataset=make_sft_dataset(4),
                     args=RFSFTConfig(output_dir=str(tmp_path), **BASE),
                     policy=SuccessiveHalving("eval_loss"))


def test_policy_is_no_save_strategy(tmp_path):
    with pytest.raises((ValueError, RFConfigError), match="policy"):
        RFSFTConfig(output_dir=str(tmp_path), **{**BASE, "save_strategy": "policy"})


def test_policy_work_grows_with_what_changed_not_with_the_runs(tmp_path):
    # The policy's context is kept up to date with the runs that moved: the histories made
    # for it follow what changed (a chunk trained, its record, a run's first claim, an op),
    # not every run at every boundary (16 x 40 = 640 at 16 runs before), and the stats count
    # evaluations as they happen.
    for n in (4, 16):
        lrs = [1e-4 * 1.5 ** i for i in range(n)]
        rf = _experiment(tmp_path / f"n{n}", "policy", SuccessiveHalving(eta=2), lrs=lrs)
        rf.train()
        stats = rf.engine.stats
        chunks = len(rf.schedule)
        assert stats.evaluations == sum(len(_eval_chunks(rf, r.name)) for r in rf.runs)
        assert stats.evaluation_seconds > 0 and stats.policy_seconds > 0
        changes = chunks + len(rf.op_log) + n
        assert n <= stats.policy_histories <= n + 2 * changes, (n, stats, changes)
        assert stats.policy_histories < n * chunks / 3 or n == 4


def test_a_run_builds_its_eval_loader_once_and_evaluates_as_a_fresh_one(tmp_path, monkeypatch):
    # A new loader per evaluation re-derived the eval set and prepared a new loader each time
    # (about half of an evaluation of 32 rows on the tiny model): a run keeps its own.
    import transformers

    built = []
    make = transformers.Trainer._get_dataloader

    def counted(self, dataset, description, *args, **kwargs):
        built.append(description)
        return make(self, dataset, description, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "_get_dataloader", counted)
    rf = _experiment(tmp_path / "e", "chunk", None, lrs=[1e-3, 1e-2])
    rf.train()
    assert rf.engine.stats.evaluations == 2 * CHUNKS
    assert built.count("Evaluation") == 2  # one a run
    trainer = rf.run_trainer(rf.best_run.name)
    rf.engine.activate(rf.best_run.name)
    kept = trainer.evaluate()["eval_loss"]
    other = make_sft_dataset(8, seed=9)  # the same rows, given to the call: a loader of its own
    fresh = trainer.evaluate(eval_dataset=other)["eval_loss"]
    assert kept == fresh == rf.best_run.metrics["eval_loss"]
    assert built.count("Evaluation") == 3
