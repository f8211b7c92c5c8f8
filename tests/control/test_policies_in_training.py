"""Policies driving a real experiment: their decisions are ordinary ops, with reasons."""

from __future__ import annotations

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.control.policies import Budget, RunHistory, SuccessiveHalving, metric_at
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


def _trainer(out, policy, lrs=(1e-5, 1e-4, 3e-3, 1e-2)):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(list(lrs)), num_chunks=4,
                         num_train_epochs=1, per_device_train_batch_size=4,
                         eval_strategy="chunk", per_device_eval_batch_size=8,
                         **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(48, seed=1),
        eval_dataset=make_sft_dataset(16, seed=9),
        peft_config=tiny_lora_config(r=4),
        policy=policy,
    )


def test_successive_halving_stops_the_worse_half_at_each_rung_with_reasons(tmp_path):
    rf = _trainer(tmp_path / "exp", SuccessiveHalving("eval_loss", "min", eta=2))
    rf.train()
    auto = [o for o in rf.op_log if o.source == "policy:SuccessiveHalving"]
    assert auto and all(o.op == "stop" for o in auto)
    assert all(o.result.startswith("ok: stopped at step ") and " by SuccessiveHalving rung "
               in o.result and "not in best 1/2" in o.result for o in auto)
    status = {r.name: r.status for r in rf.runs}
    stopped = {o.run for o in auto}
    assert all(status[n] == RunStatus.STOPPED for n in stopped)
    assert RunStatus.COMPLETED in status.values()
    # Each stop checked against the runs' logged eval losses: at its rung (2**k chunks),
    # some other run that reached the rung had a strictly better value.
    for o in auto:
        chunks = 2 ** int(o.result.split(" rung ")[1].split(":")[0])
        values = {}
        for name, slot in rf.engine.slots.items():
            history = RunHistory(name, slot.state.status, slot.state.chunks_done,
                                 len(slot.plan), tuple(c.end_step for c in slot.plan.chunks),
                                 tuple(slot.trainer.state.log_history))
            if history.chunks_done >= chunks:
                values[name] = metric_at(history, "eval_loss", chunks)
        assert min(v for n, v in values.items() if n != o.run) < values[o.run]
    best = rf.best_run
    assert best.status == RunStatus.COMPLETED and best.name not in stopped
    # Stopped runs left the shared model's module tree (their parameters live on).
    slots = rf.engine.slots
    names = [n for n, _ in slots[best.name].group.model.named_parameters()]
    assert all(not any(f".{slots[s].adapter}." in n for n in names) for s in stopped)


def test_a_persons_op_on_a_run_wins_over_the_policys(tmp_path):
    rf = _trainer(tmp_path / "exp", None, lrs=(1e-4, 3e-3))
    engine = rf.engine
    done = {"queued": False}

    def both_ops_at_one_boundary():
        if not done["queued"] and engine.slots["run-0"].state.chunks_done == 1:
            engine.queue_op("run-1", "stop", source="policy:Test", reason="because")
            rf.delete("run-1")
            done["queued"] = True

    engine.hooks.at_boundary = both_ops_at_one_boundary
    rf.train()
    log = [(o.source, o.run, o.op, o.result) for o in rf.op_log]
    assert log == [("policy:Test", "run-1", "stop", "skipped: a person's op on this run wins"),
                   ("python", "run-1", "delete", "ok: deleted")]


def test_a_budget_stops_everything_resumably(tmp_path):
    # In a list, the op log names the policy that decided (halving has no rung before the
    # last of 4 chunks here, so it never does).
    rf = _trainer(tmp_path / "exp", [SuccessiveHalving(min_chunks=4), Budget(max_total_steps=8)],
                  lrs=(1e-4, 3e-3))
    rf.train()
    # 12 steps a run, 3 a chunk: the budget is spent once 8 steps are trained in all.
    assert [r.status for r in rf.runs] == [RunStatus.STOPPED] * 2
    assert sum(r.global_step for r in rf.runs) in (9, 12)
    assert all("budget spent" in o.result for o in rf.op_log)
    assert {o.source for o in rf.op_log} == {"policy:Budget"}
    assert all(" by Budget budget spent" in o.result for o in rf.op_log)


def test_population_based_replaces_the_worse_run_by_a_warm_clone_of_the_better(tmp_path):
    from trl_rapidfire import PopulationBased

    pbt = PopulationBased("eval_loss", "min", interval_chunks=2, quantile=0.5,
                          mutations={"learning_rate": 2.0}, seed=3)
    rf = _trainer(tmp_path / "exp", pbt, lrs=(1e-5, 3e-3))
    rf.train()
    auto = [(o.run, o.op.split(" ")[0], o.result.split(" ")[1]) for o in rf.op_log]
    assert auto[:2] == [("run-0", "stop", "stopped"), ("run-1", "clone-warm", "created")]
    runs = {r.name: r for r in rf.runs}
    assert runs["run-0"].status == RunStatus.STOPPED
    clone = runs["run-2"]
    assert clone.knobs["learning_rate"] in (6e-3, 1.5e-3)
    assert rf.engine.slots["run-2"].state.parent == "run-1"
    assert rf.engine.slots["run-2"].state.warm_start


def test_a_wall_clock_budget_spans_re_runs(tmp_path):

    out = tmp_path / "exp"
    first = _trainer(out, Budget(max_total_steps=3), lrs=(1e-4, 3e-3))
    first.train()
    assert [r.status for r in first.runs] == [RunStatus.STOPPED] * 2
    spent = FileStore(out / ".rapidfire", "", create=False).peek().wall_seconds
    assert spent > 0
    # The re-run's own time is far under the budget; the experiment's is not.
    again = _trainer(out, Budget(max_wall_seconds=spent), lrs=(1e-4, 3e-3))
    again.resume("run-0")
    again.resume("run-1")
    again.train()
    # The re-run's log goes on from the first's (ops.csv): its own stops come after.
    assert ([(o.source, o.run, o.op, o.result) for o in again.op_log[:len(first.op_log)]]
            == [(o.source, o.run, o.op, o.result) for o in first.op_log])
    stops = [o for o in again.op_log[len(first.op_log):] if o.op == "stop"]
    assert stops and all("budget spent" in o.result and f"of {spent:g} s" in o.result
                         for o in stops)
    assert [r.status for r in again.runs] == [RunStatus.STOPPED] * 2
    assert sum(r.global_step for r in again.runs) < 24
