"""A person's op wins over the policy, and its answer stays the person's (docs/policies.md, "A
person's op wins"): a run a person resumes is not stopped again by the policy at the boundary
it was resumed at, however often the policy is asked about it there (a halving policy asks
again whenever another run reaches the rung; a re-run asks about every run), and is judged
again from its next decision point on. Real training of tiny runs, each policy in turn."""

from __future__ import annotations

import pytest

from trl_rapidfire import (
    Hyperband,
    List,
    PopulationBased,
    RFSFTConfig,
    RFSFTTrainer,
    SuccessiveHalving,
)
from trl_rapidfire.control.ops import read_op_rows
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

# Eight runs: run-0 learns slowest, so the halving policies stop it first, while most runs
# have still to reach the rung (and the policy asks about run-0 again at each arrival).
EIGHT = (1e-6, 1e-2, 8e-3, 6e-3, 5e-3, 4e-3, 3e-3, 2e-3)


def _trainer(out, policy, lrs, *, chunks=2, rows=16, **extra):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List(list(lrs)), num_chunks=chunks,
                         num_train_epochs=1, per_device_train_batch_size=4,
                         eval_strategy="policy", per_device_eval_batch_size=8,
                         **{**cpu_training_kwargs(), **extra}),
        train_dataset=make_sft_dataset(rows, seed=1),
        eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4),
        policy=policy,
    )


class _Person:
    """At each boundary: resumes the first run a policy stopped, once it sees the stop in the op
    log (as a person clicking Resume in a panel); ``then``: called right after."""

    def __init__(self, rf, then=None):
        self.rf, self.then, self.resumed = rf, then, None

    def __call__(self):
        if self.resumed is not None:
            return
        stop = next((o for o in self.rf.op_log if o.source.startswith("policy:")
                     and o.result.startswith("ok: stopped")), None)
        if stop is not None:
            self.resumed = stop.run
            self.rf.resume(stop.run)
            if self.then is not None:
                self.then()


def _resume_record(log, run):
    [(at, record)] = [(i, o) for i, o in enumerate(log) if o.run == run and o.op == "resume"]
    assert record.source == "python" and record.result.startswith("ok: resumed at step ")
    return at, int(record.result.rsplit(" ", 1)[1])


def _stopped_again_at(log, run, step, after):
    """The policy's stops of ``run`` at ``step`` after the op log's record ``after``."""
    return [(o.source, o.result) for o in log[after + 1:] if o.run == run
            and o.source.startswith("policy:") and o.result.startswith(f"ok: stopped at step "
                                                                       f"{step} ")]


def _check_resumed_run_trained_on(rf, run, log):
    at, step = _resume_record(log, run)
    assert _stopped_again_at(log, run, step, at) == []
    runs = {r.name: r for r in rf.runs}
    # Its last chunk is no rung: it trains to its end, and its answer is still the person's.
    assert runs[run].status == RunStatus.COMPLETED and runs[run].global_step > step
    assert runs[run].last_op == f"ok: resumed at step {step}"
    on_disk = [o for o in read_op_rows(Layout(rf.args.output_dir).ops_log) if o.run == run]
    assert on_disk[-1].result == f"ok: resumed at step {step}"
    return step


def test_successive_halving_does_not_stop_a_resumed_run_again_at_its_rung(tmp_path, monkeypatch):
    # Before: run-0 was stopped at rung 0 again when run-6 arrived there, 2 boundaries after
    # the person's resume, without training a step; its tag's answer became the policy's.
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    rf = _trainer(tmp_path / "exp", SuccessiveHalving("eval_loss", "min", eta=2), EIGHT,
                  report_to="mlflow")
    person = _Person(rf)
    rf.engine.hooks.at_boundary = person
    rf.train()
    assert person.resumed == "run-0"
    log = rf.op_log
    at, step = _resume_record(log, "run-0")
    # Runs still arrived at the rung after the resume: the policy was asked about run-0 again.
    arrived_after = {s.run for s in rf.schedule if s.number == 0 and s.start_time
                     > log[at].time}
    assert arrived_after, [(s.run, s.number) for s in rf.schedule]
    _check_resumed_run_trained_on(rf, "run-0", log)
    # The person's answer is the run's op result in MLflow too.
    tags = MlflowClient(uri).get_run(rf.engine.tracker.run_id("run-0")).data.tags
    assert tags["rapidfire.op.result"] == f"ok: resumed at step {step}"
    # The others were still halved at the rung: the policy is not off, only overruled on run-0.
    stopped = {o.run for o in log if o.source == "policy:SuccessiveHalving"}
    assert len(stopped - {"run-0"}) >= 2


def test_hyperband_does_not_stop_a_resumed_run_again_at_its_bracket_rung(tmp_path):
    hb = Hyperband("eval_loss", "min", eta=2)
    # Two brackets at 2 chunks; bracket 0 (rung at chunk 1) holds run-0, run-2, run-4, run-6.
    assert hb.brackets_of([f"run-{i}" for i in range(8)], 2)[0] == [
        "run-0", "run-2", "run-4", "run-6"]
    rf = _trainer(tmp_path / "exp", hb, EIGHT)
    person = _Person(rf)
    rf.engine.hooks.at_boundary = person
    rf.train()
    assert person.resumed == "run-0"
    log = rf.op_log
    at, _ = _resume_record(log, "run-0")
    assert any(s.run == "run-6" and s.number == 0 and s.start_time > log[at].time
               for s in rf.schedule)  # its bracket's last run arrived after the resume
    _check_resumed_run_trained_on(rf, "run-0", log)


def _interrupt_after_the_resume(rf):
    def interrupt():
        rf.engine.interrupted = True  # what a Ctrl-C's handler sets: no chunk of it after
    return interrupt


def _resumed_then_rerun(tmp_path, make_policy, lrs, chunks):
    """A policy stops a run; a person resumes it; Ctrl-C before it trains again; the script
    runs again. Returns (the re-run's trainer, the resumed run, its resume step)."""
    out = tmp_path / "exp"
    first = _trainer(out, make_policy(), lrs, chunks=chunks)
    person = _Person(first)
    person.then = _interrupt_after_the_resume(first)
    first.engine.hooks.at_boundary = person
    with pytest.raises(KeyboardInterrupt):
        first.train()
    run = person.resumed
    assert run is not None
    at, step = _resume_record(first.op_log, run)
    assert {r.name: r for r in first.runs}[run].global_step == step  # not trained since
    again = _trainer(out, make_policy(), lrs, chunks=chunks)
    again.train()
    return again, run, step


def test_population_based_does_not_stop_or_replace_a_resumed_run_again_after_a_rerun(tmp_path):
    # Before: the re-run asked the policy about every run; the resumed run-0 was stopped again
    # at the same step and a second warm clone of run-1 made to replace it.
    def pbt():
        return PopulationBased("eval_loss", "min", interval_chunks=2, quantile=0.5,
                               mutations={"learning_rate": 2.0}, seed=3)

    again, run, step = _resumed_then_rerun(tmp_path, pbt, (1e-6, 3e-3), chunks=4)
    assert run == "run-0"
    log = again.op_log
    at, _ = _resume_record(log, run)
    assert _stopped_again_at(log, run, step, at) == []
    replacing = [o for o in log if o.op.startswith("clone-warm")]
    assert len(replacing) == 1  # the one made with the first stop, before the resume
    runs = {r.name: r for r in again.runs}
    assert sorted(runs) == ["run-0", "run-1", "run-2"]
    assert runs[run].status == RunStatus.COMPLETED and runs[run].global_step > step


def test_optuna_pruner_does_not_prune_a_resumed_run_again_after_a_rerun(tmp_path):
    optuna = pytest.importorskip("optuna")
    from trl_rapidfire import OptunaPruner

    def pruner():
        return OptunaPruner(optuna.pruners.SuccessiveHalvingPruner(min_resource=1,
                                                                   reduction_factor=2))

    # One step a chunk: Optuna's halving judges each run on arrival at steps 1, 2, ...
    again, run, step = _resumed_then_rerun(tmp_path, pruner, (3e-3, 1e-6, 2e-3, 1e-3),
                                           chunks=4)
    log = again.op_log
    at, _ = _resume_record(log, run)
    assert _stopped_again_at(log, run, step, at) == []
    resumed = {r.name: r for r in again.runs}[run]
    # Judged again from its next report on (it may be pruned there, as any run may).
    assert resumed.global_step > step


def test_a_policys_skipped_op_leaves_the_persons_answer_on_the_run(tmp_path):
    # The person's op queued before the policy's at the same boundary: before, the policy's
    # "skipped" answer came last and became the run's answer.
    rf = _trainer(tmp_path / "exp", None, (1e-4, 3e-3))
    engine = rf.engine
    rf.stop("run-1")
    done = {"queued": False}

    def person_then_policy():
        if not done["queued"] and engine.slots["run-0"].state.chunks_done == 1:
            rf.resume("run-1")
            engine.queue_op("run-1", "stop", source="policy:Test", reason="because")
            done["queued"] = True

    engine.hooks.at_boundary = person_then_policy
    rf.train()
    log = [(o.source, o.run, o.op, o.result) for o in rf.op_log]
    assert log == [("python", "run-1", "stop", "ok: stopped at step 0"),
                   ("python", "run-1", "resume", "ok: resumed at step 0"),
                   ("policy:Test", "run-1", "stop", "skipped: a person's op on this run wins")]
    runs = {r.name: r for r in rf.runs}
    assert runs["run-1"].last_op == "ok: resumed at step 0"
    assert runs["run-1"].status == RunStatus.COMPLETED


def test_a_clone_of_a_stopped_run_is_judged_from_its_own_rungs(tmp_path):
    # A clone is a new run: it trains to its own first rung before the policy judges it,
    # whatever its parent's verdict (a warm clone starts from the parent's weights, not its
    # history).
    rf = _trainer(tmp_path / "exp", SuccessiveHalving("eval_loss", "min", eta=2),
                  (1e-6, 1e-2, 5e-3, 2e-3), chunks=4)
    engine = rf.engine
    cloned = {}

    def clone_the_stopped():
        stop = next((o for o in rf.op_log if o.source.startswith("policy:")
                     and o.result.startswith("ok: stopped")), None)
        if stop is not None and not cloned:
            cloned["parent"] = stop.run
            rf.clone(stop.run, {}, warm=True)

    engine.hooks.at_boundary = clone_the_stopped
    rf.train()
    [made] = [o for o in rf.op_log if o.op.startswith("clone-warm")]
    name = made.result.split()[2]
    clone = {r.name: r for r in rf.runs}[name]
    first_rung_step = engine.slots[name].plan.chunks[0].end_step
    assert clone.global_step >= first_rung_step
    stops = [o for o in rf.op_log if o.run == name and o.source.startswith("policy:")]
    assert all(int(o.result.split()[4]) >= first_rung_step for o in stops)
