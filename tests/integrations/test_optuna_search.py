"""OptunaSearch driving real experiments: a sampler proposes runs while others train, K at a
time, each told once; every run is still bitwise its plain TRL run; a person's stop and clone
reach the study; a re-run (also after kill -9) proposes the same configs."""

from __future__ import annotations

import csv
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

from trl_rapidfire import List, Range, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.search.searches import SearchError
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

optuna = pytest.importorskip("optuna")

from plain_sft import assert_each_run_is_plain_sft  # noqa: E402

from trl_rapidfire.integrations.optuna.search import OptunaSearch  # noqa: E402

HERE = Path(__file__).resolve().parents[1]
SCHEDULERS = ["linear", "cosine", "constant"]
BASE = dict(cpu_training_kwargs(), num_chunks=3, num_train_epochs=1,
            per_device_train_batch_size=4, eval_strategy="chunk", per_device_eval_batch_size=8,
            logging_steps=1, seed=5)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _trainer(out, search, *, callbacks=None, policy=None, rows=24):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=Range(1e-5, 1e-1, log=True),
                         lr_scheduler_type=List(SCHEDULERS), **BASE),
        train_dataset=make_sft_dataset(rows, seed=1),
        eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4),
        search=search, callbacks=callbacks, policy=policy,
    )


def _search_log(out) -> list[dict]:
    with open(Path(out) / "search.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _proposals(out) -> list[tuple[str, dict]]:
    return [(r["run"], json.loads(r["detail"])) for r in _search_log(out)
            if r["event"] == "proposed"]


def _study(out):
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(Path(out) / ".rapidfire" / "optuna.journal")))
    return optuna.load_study(study_name="trl-rapidfire", storage=storage)


def _assert_same_adapter(ours_dir: Path, theirs_dir: Path, what: str) -> None:
    """The two folders' adapters hold the same tensors, bitwise."""
    ours = load_file(Path(ours_dir) / "adapter_model.safetensors")
    theirs = load_file(Path(theirs_dir) / "adapter_model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), what


def _in_flight_at_most(schedule_csv: Path) -> int:
    """The most runs started and not yet finished at any point of the schedule."""
    rows = list(csv.DictReader(open(schedule_csv, newline="", encoding="utf-8")))
    first, last = {}, {}
    for i, row in enumerate(rows):
        first.setdefault(row["run"], i)
        last[row["run"]] = i
    return max(sum(1 for r in first if first[r] <= i <= last[r]) for i in range(len(rows)))


def test_tpe_proposes_k_at_a_time_each_told_once_and_each_run_is_plain_trl_bitwise(tmp_path):
    out = tmp_path / "exp"
    rf = _trainer(out, OptunaSearch(num_runs=5, max_concurrent=2, seed=3))
    rf.train()

    proposals = _proposals(out)
    assert [name for name, _ in proposals] == [f"run-{i}" for i in range(5)]
    assert _in_flight_at_most(out / "schedule.csv") == 2
    # A proposal after the first two joined only once a run had left the rotation, and was
    # proposed after that run's result was told.
    log = _search_log(out)
    told_at = {r["run"]: i for i, r in enumerate(log) if r["event"] == "told"}
    proposed_at = {r["run"]: i for i, r in enumerate(log) if r["event"] == "proposed"}
    assert sorted(told_at) == [f"run-{i}" for i in range(5)]
    assert min(told_at.values()) < proposed_at["run-2"]

    study = _study(out)
    trials = study.get_trials()
    assert [t.user_attrs["run"] for t in trials] == [f"run-{i}" for i in range(5)]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    for trial, run in zip(trials, sorted(rf.runs, key=lambda r: int(r.name[4:]))):
        assert run.status == RunStatus.COMPLETED
        assert trial.params == {"learning_rate": run.knobs["learning_rate"],
                                "lr_scheduler_type": run.knobs["lr_scheduler_type"]}
        # Told its value at every chunk end (the eval loss logged there), and the last one.
        evals = [e for e in rf.run_trainer(run.name).state.log_history if "eval_loss" in e]
        assert trial.intermediate_values == {e["step"]: e["eval_loss"] for e in evals}
        assert trial.value == evals[-1]["eval_loss"]
        assert 1e-5 <= run.knobs["learning_rate"] <= 1e-1
        assert run.knobs["lr_scheduler_type"] in SCHEDULERS

    # Each run, proposed at the start or mid-experiment, ends bitwise as plain TRL trains its
    # config alone.
    config = {k: v for k, v in BASE.items() if k != "num_chunks"}
    config["eval_strategy"] = "no"
    assert_each_run_is_plain_sft(rf, out, tmp_path / "plain", config, rows=24)

    # The same script again on a fresh folder proposes the same configs, in the same order.
    again = tmp_path / "again"
    _trainer(again, OptunaSearch(num_runs=5, max_concurrent=2, seed=3)).train()
    assert _proposals(again) == proposals
    # Another seed, other proposals.
    other = tmp_path / "other"
    _trainer(other, OptunaSearch(num_runs=2, max_concurrent=2, seed=4)).train()
    assert _proposals(other) != proposals[:2]


class _ReadStudy(TrainerCallback):
    """In run-0's third chunk, what the study holds of it (another process could read the
    same file then)."""

    def __init__(self, out):
        self.out = out

    def on_step_begin(self, args, state, control, **kwargs):
        if args.output_dir.endswith("run-0") and state.global_step == 5:
            trial = next(t for t in _study(self.out).get_trials()
                         if t.user_attrs["run"] == "run-0")
            _RF["seen"] = (trial.state, dict(trial.intermediate_values))


def test_intermediate_values_reach_the_study_as_chunks_are_recorded(tmp_path):
    out = tmp_path / "exp"
    _RF.clear()
    rf = _trainer(out, OptunaSearch(num_runs=2, max_concurrent=2, seed=3),
                  callbacks=[_ReadStudy(out)])
    rf.train()
    state, values = _RF["seen"]
    assert state == optuna.trial.TrialState.RUNNING
    evals = {e["step"]: e["eval_loss"] for e in rf.run_trainer("run-0").state.log_history
             if "eval_loss" in e}
    # The first chunk's value at least (the second's record may still be on its way).
    assert 2 in values and values.items() <= evals.items() and 6 not in values


_RF: dict = {}


class _PersonActs(TrainerCallback):
    """At run-1's first optimizer step of its second chunk, a person (tags) stops run-1 and
    clones run-0 with a learning rate outside the search's Range."""

    def on_step_begin(self, args, state, control, **kwargs):
        if args.output_dir.endswith("run-1") and state.global_step == 3 and not _RF.get("done"):
            _RF["done"] = True
            _RF["rf"].engine.queue_op("run-1", "stop", source="tag")
            _RF["rf"].engine.queue_op("run-0", 'clone {"learning_rate": 0.5}', source="tag")


def test_a_persons_stop_and_clone_are_told_to_the_study(tmp_path):
    out = tmp_path / "exp"
    _RF.clear()
    rf = _trainer(out, OptunaSearch(num_runs=4, max_concurrent=2, seed=3),
                  callbacks=[_PersonActs()])
    _RF["rf"] = rf
    rf.train()
    status = {r.name: r.status for r in rf.runs}
    assert status["run-1"] == RunStatus.STOPPED
    clone = next(o.result.split()[2] for o in rf.op_log if o.op.startswith("clone"))
    assert status[clone] == RunStatus.COMPLETED
    # The stop freed a place: the sampler still proposed its 4 runs, and K held throughout
    # (the clone made 3 for a while: a person's run is theirs to add).
    assert len(_proposals(out)) == 4

    by_run = {t.user_attrs["run"]: t for t in _study(out).get_trials()}
    stopped = by_run["run-1"]
    assert stopped.state == optuna.trial.TrialState.PRUNED
    evals = [e for e in rf.run_trainer("run-1").state.log_history if "eval_loss" in e]
    assert stopped.intermediate_values == {e["step"]: e["eval_loss"] for e in evals}
    added = by_run[clone]
    assert added.user_attrs["clone_of"] == "run-0"
    assert added.state == optuna.trial.TrialState.COMPLETE
    assert added.params["learning_rate"] == 0.5
    assert added.params["lr_scheduler_type"] == rf.engine.slots["run-0"].knobs[
        "lr_scheduler_type"]
    assert added.distributions["learning_rate"].high == 0.5  # widened for this trial only
    final = [e for e in rf.run_trainer(clone).state.log_history if "eval_loss" in e][-1]
    assert added.value == final["eval_loss"]
    assert sum(1 for r in _search_log(out) if r["event"] == "told") == len(rf.runs)


def test_pruner_stops_are_ops_with_reasons_and_pruned_trials(tmp_path):
    from trl_rapidfire import OptunaPruner

    out = tmp_path / "exp"
    # 6 steps a run, chunks of 2: the first rung is at step 2, the second at 4.
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=2)
    rf = _trainer(out, OptunaSearch(num_runs=6, max_concurrent=2, seed=3),
                  policy=OptunaPruner(pruner))
    rf.train()
    stops = [o for o in rf.op_log if o.source == "policy:OptunaPruner"]
    assert stops and all(o.op == "stop" for o in stops)
    assert all(o.result.startswith("ok: stopped at step ") and
               " by OptunaPruner SuccessiveHalvingPruner pruned it at step " in o.result
               for o in stops)
    by_run = {t.user_attrs["run"]: t for t in _study(out).get_trials()}
    status = {r.name: r.status for r in rf.runs}
    for o in stops:
        assert status[o.run] == RunStatus.STOPPED
        assert by_run[o.run].state == optuna.trial.TrialState.PRUNED
        # Pruned at the rung named in the reason, with the value it had there.
        step = int(o.result.split(" pruned it at step ")[1].split()[0])
        assert max(by_run[o.run].intermediate_values) == step
    # Each stop freed a place in the rotation: the sampler still proposed all 6 runs.
    assert len(by_run) == 6 and len(_proposals(out)) == 6
    assert {t.state for n, t in by_run.items() if status[n] == RunStatus.COMPLETED} == {
        optuna.trial.TrialState.COMPLETE}


def test_a_spent_budget_ends_the_search_instead_of_starting_runs_it_would_stop(tmp_path):
    from trl_rapidfire import Budget

    out = tmp_path / "exp"
    # Each run is 6 steps in chunks of 2; 16 steps is spent within the third run.
    rf = _trainer(out, OptunaSearch(num_runs=6, max_concurrent=2, seed=3),
                  policy=Budget(max_total_steps=16))
    rf.train()
    steps = sum(r.global_step for r in rf.runs)
    assert 16 <= steps < 16 + 2 * 2  # at most one chunk of each run in the rotation over
    # No run was proposed only to be stopped before its first chunk: once the budget was
    # spent the sampler proposed nothing more.
    assert all(r.global_step > 0 for r in rf.runs) and len(rf.runs) < 6
    assert len(_proposals(out)) == len(rf.runs)
    states = {t.user_attrs["run"]: t.state for t in _study(out).get_trials()}
    expected = {r.name: (optuna.trial.TrialState.COMPLETE if r.status == RunStatus.COMPLETED
                         else optuna.trial.TrialState.PRUNED) for r in rf.runs}
    assert states == expected and optuna.trial.TrialState.PRUNED in states.values()


def test_a_rerun_with_a_bigger_budget_continues_the_study(tmp_path):
    out = tmp_path / "exp"
    _trainer(out, OptunaSearch(num_runs=2, max_concurrent=2, seed=3)).train()
    first = _proposals(out)
    rf = _trainer(out, OptunaSearch(num_runs=3, max_concurrent=2, seed=3))
    rf.train()
    assert _proposals(out)[:2] == first and len(_proposals(out)) == 3
    assert [t.state for t in _study(out).get_trials()] == [optuna.trial.TrialState.COMPLETE] * 3
    # The first two were not trained again.
    assert {r.name: r.status for r in rf.runs} == {f"run-{i}": RunStatus.COMPLETED
                                                    for i in range(3)}
    assert sum(1 for r in _search_log(out) if r["event"] == "told") == 3


def test_status_of_an_untracked_search_shows_each_runs_trial(tmp_path, capsys):
    from trl_rapidfire.client.cli import main

    out = tmp_path / "exp"
    _trainer(out, OptunaSearch(num_runs=3, max_concurrent=2, seed=3)).train()
    capsys.readouterr()
    assert main(["status", "--output-dir", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("run"))
    assert header.split()[:3] == ["run", "trial", "status"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("run-")}
    assert {name: row[1] for name, row in rows.items()} == {"run-0": "0", "run-1": "1",
                                                           "run-2": "2"}


def test_status_and_report_show_which_runs_the_sampler_proposed_and_when(tmp_path, monkeypatch,
                                                                       capsys):
    from trl_rapidfire.client.cli import main
    from trl_rapidfire.reports.plots import write_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = tmp_path / "exp"
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=Range(1e-5, 1e-1, log=True),
                         **{**BASE, "num_chunks": 2, "report_to": "mlflow"}),
        train_dataset=make_sft_dataset(16, seed=1), eval_dataset=make_sft_dataset(8, seed=9),
        peft_config=tiny_lora_config(r=4),
        search=OptunaSearch(num_runs=3, max_concurrent=1, seed=3),
    )
    rf.train()
    capsys.readouterr()
    assert main(["status", "--uri", uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("run"))
    assert header.split()[:4] == ["run", "status", "trial", "proposed"]
    for i in range(3):
        row = next(line for line in lines if line.startswith(f"run-{i} ")).split()
        assert row[1] == "completed" and row[2] == str(i)
        assert row[3] == time.strftime("%Y-%m-%d")  # the day it was proposed (then the time)

    files = write_report(out, tmp_path / "report", tracking_uri=uri)
    summary = files.summary.read_text()
    assert "## Search" in summary
    rows = [line for line in summary.splitlines() if line.startswith("| ") and " s |" in line]
    assert [r.split("|")[2].strip() for r in rows] == ["run-0", "run-1", "run-2"]
    # One at a time: each run after the first was proposed once its predecessor was told.
    told = {e["run"] for e in _search_log(out) if e["event"] == "told"}
    assert all("COMPLETE" in row.split("|")[5] for row in rows) and len(told) == 3
    proposed = [float(r.split("|")[3].strip().lstrip("+").split()[0]) for r in rows]
    assert proposed[0] == 0.0 < proposed[1] < proposed[2]


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_runs=0), "num_runs >= 1"),
    (dict(num_runs=2, max_concurrent=0), "max_concurrent >= 1"),
    (dict(num_runs=2, direction="down"), "'minimize' or 'maximize'"),
    (dict(num_runs=2, metric=""), "metric"),
    (dict(num_runs=2, seed=1.5), "seed must be an integer"),
    (dict(num_runs=2, sampler="tpe"), "sampler must be an Optuna sampler"),
    (dict(num_runs=2, order="deepest"), r"order must be one of \['even', 'promote'\]"),
])
def test_bad_search_arguments_name_the_argument(kwargs, match):
    with pytest.raises(SearchError, match=match):
        OptunaSearch(**kwargs)


def test_an_eval_metric_without_evaluation_is_refused_before_training(tmp_path):
    with pytest.raises(RFConfigError, match="eval_strategy='policy'.*'chunk'"):
        RFSFTTrainer(model=tiny_model_path(),
                     args=RFSFTConfig(output_dir=str(tmp_path), learning_rate=Range(1e-5, 1e-2),
                                      **dict(BASE, eval_strategy="no")),
                     train_dataset=make_sft_dataset(8), peft_config=tiny_lora_config(r=4),
                     search=OptunaSearch(num_runs=2))
    assert not (tmp_path / "runs").exists()


def test_a_search_without_knobs_is_refused(tmp_path):
    with pytest.raises(SearchError, match="at least one knob"):
        RFSFTTrainer(model=tiny_model_path(), args=RFSFTConfig(output_dir=str(tmp_path), **BASE),
                     train_dataset=make_sft_dataset(8), eval_dataset=make_sft_dataset(4),
                     search=OptunaSearch(num_runs=2))


def test_without_optuna_the_classes_say_how_to_install_it(monkeypatch):
    from trl_rapidfire.integrations.optuna.support import OptunaMissing

    monkeypatch.setitem(sys.modules, "optuna", None)
    # A command that works whether the package came from a clone or not (no such distribution
    # as trl-rapidfire[optuna] on an index), and the clone's extra.
    with pytest.raises(OptunaMissing, match=r"pip install optuna .*pip install -e '\.\[optuna\]'"):
        OptunaSearch(num_runs=2)


def test_what_identifies_a_search_over_a_config_group():
    def doc(search, lr=None, **config):
        kwargs = {k: v for k, v in BASE.items() if k not in config}
        lr = lr or Range(1e-5, 1e-1, log=True)
        return search.describe(RFSFTConfig(output_dir="x", learning_rate=lr, **kwargs,
                                           **config), model="m")

    first = doc(OptunaSearch(num_runs=2, max_concurrent=2))
    # More runs, more at a time, where it reports: the same experiment, continued.
    assert doc(OptunaSearch(num_runs=9, max_concurrent=3)) == first
    assert doc(OptunaSearch(num_runs=2), report_to="mlflow") == first
    # Another seed, space, direction or config: another experiment.
    assert doc(OptunaSearch(num_runs=2, seed=1)) != first
    assert doc(OptunaSearch(num_runs=2), lr=Range(1e-5, 1e-2, log=True)) != first
    assert doc(OptunaSearch(num_runs=2, direction="maximize")) != first
    assert doc(OptunaSearch(num_runs=2), warmup_steps=2) != first


def test_knobs_map_to_distributions_and_back():
    from peft import LoraConfig

    from trl_rapidfire.integrations.optuna.space import SearchSpace

    search = OptunaSearch(num_runs=2)
    lora = [LoraConfig(r=4, target_modules=["q_proj"]), LoraConfig(r=8, target_modules=["q_proj"])]
    config = RFSFTConfig(output_dir="unused", learning_rate=Range(1e-5, 1e-1, log=True),
                         per_device_train_batch_size=Range(2, 8),
                         lr_scheduler_type=List(SCHEDULERS),
                         **{k: v for k, v in BASE.items() if k != "per_device_train_batch_size"})
    space = search.space(config, {"peft_config": List(lora), "model": "m"})
    assert isinstance(space, SearchSpace)
    d = space.distributions
    assert d["learning_rate"] == optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True)
    assert d["per_device_train_batch_size"] == optuna.distributions.IntDistribution(2, 8)
    assert d["lr_scheduler_type"].choices == tuple(SCHEDULERS)
    assert d["peft_config"].choices == (0, 1)  # objects by position
    knobs = space.knobs({"learning_rate": 1e-3, "per_device_train_batch_size": 4,
                         "lr_scheduler_type": "cosine", "peft_config": 1})
    assert knobs == {"learning_rate": 1e-3, "per_device_train_batch_size": 4,
                     "lr_scheduler_type": "cosine", "peft_config": lora[1]}
    for bad in ({"learning_rate": 2.0}, {"lr_scheduler_type": "step"}, {"peft_config": True},
                {"per_device_train_batch_size": 4.5}):
        params = {"learning_rate": 1e-3, "per_device_train_batch_size": 4,
                  "lr_scheduler_type": "cosine", "peft_config": 1, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            space.knobs(params)
    with pytest.raises(ValueError, match="missing"):
        space.knobs({"learning_rate": 1e-3})
    # A clone's knobs: a value outside the Range widens that trial's distribution; a value
    # that is no candidate of a List cannot be a trial.
    params, dists = space.params({**knobs, "learning_rate": 0.5})
    assert params["learning_rate"] == 0.5 and dists["learning_rate"].high == 0.5
    assert params["peft_config"] == 1
    assert "not one of its List's candidates" in space.params({**knobs, "peft_config": None})


# ---------------------------------------------------------------------------- processes


def _script_env(tmp_path, **extra):
    from launched import launch_env

    return launch_env(tmp_path, **extra)


@pytest.mark.slow
def test_a_rerun_after_kill_9_proposes_the_same_configs_and_tells_each_once(tmp_path):
    script = HERE / "optuna_script.py"
    whole = tmp_path / "whole"
    subprocess.run([sys.executable, str(script), str(whole)], check=True, timeout=600,
                   env=_script_env(tmp_path), capture_output=True)
    expected = _proposals(whole)
    assert len(expected) == 6

    killed = tmp_path / "killed"
    # run-3 (proposed mid-experiment) killed in its second chunk, the whole process group.
    done = subprocess.run([sys.executable, str(script), str(killed)], timeout=600,
                          env=_script_env(tmp_path, RF_TEST_KILL="run-3:4"),
                          capture_output=True, start_new_session=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    before = _proposals(killed)
    assert 4 <= len(before) < 6 and before == expected[:len(before)]
    subprocess.run([sys.executable, str(script), str(killed)], check=True, timeout=600,
                   env=_script_env(tmp_path), capture_output=True)
    assert _proposals(killed) == expected
    trials = _study(killed).get_trials()
    assert [t.user_attrs["run"] for t in trials] == [f"run-{i}" for i in range(6)]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    told = [r["run"] for r in _search_log(killed) if r["event"] == "told"]
    assert sorted(told) == sorted(set(told)) == [f"run-{i}" for i in range(6)]
    # The killed run's result is its whole training's: equal to the uninterrupted one's.
    whole_values = {t.user_attrs["run"]: t.value for t in _study(whole).get_trials()}
    assert {t.user_attrs["run"]: t.value for t in trials} == whole_values
    assert all(math.isfinite(v) for v in whole_values.values())


@pytest.mark.slow
def test_two_workers_under_accelerate_launch_share_one_study(tmp_path):
    out = tmp_path / "exp"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
           "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(HERE / "optuna_script.py"), str(out)]
    started = time.time()
    # Every boundary durable: any worker may continue any run (with the 60 s default a run's
    # volatile chunks tie it to the worker that trained them, and in a 10 s experiment worker
    # 0 could take every run before worker 1 asked; the cadence is tested in test_cadence.py).
    env = _script_env(tmp_path, RF_TEST_ROWS="48", RF_TEST_CHECKPOINT_EVERY="chunk")
    done = subprocess.run(cmd, timeout=900, env=env, capture_output=True,
                          start_new_session=True)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    trials = _study(out).get_trials()
    # Each proposal asked once (no trial number taken twice), each result told once.
    assert [t.user_attrs["run"] for t in trials] == [f"run-{i}" for i in range(6)]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    log = _search_log(out)
    assert sorted(r["run"] for r in log if r["event"] == "proposed") == \
        [f"run-{i}" for i in range(6)]
    assert sorted(r["run"] for r in log if r["event"] == "told") == [f"run-{i}" for i in range(6)]
    # Both workers trained, and the K bound held across them.
    rows = list(csv.DictReader(open(out / "schedule.csv", newline="", encoding="utf-8")))
    assert {r["worker"] for r in rows} == {"0", "1"}, f"after {time.time() - started:.0f} s"
    assert _in_flight_at_most(out / "schedule.csv") <= 2
    # Whichever worker told a run's result, it is that run's final evaluation.
    for trial in trials:
        state = json.loads((out / "runs" / trial.user_attrs["run"] / "final" /
                            "trainer_state.json").read_text())
        evals = [e for e in state["log_history"] if "eval_loss" in e]
        assert trial.value == evals[-1]["eval_loss"]
        assert trial.intermediate_values == {e["step"]: e["eval_loss"] for e in evals}


def test_knobs_inside_a_lora_config_are_optuna_parameters_and_each_run_is_plain_trl(tmp_path):
    from peft import LoraConfig

    lora_rest = dict(lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                     target_modules=["q_proj", "v_proj"])
    base = {k: v for k, v in BASE.items() if k not in ("eval_strategy",
                                                          "per_device_eval_batch_size")}
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), learning_rate=1e-3, **base),
        train_dataset=make_sft_dataset(16, seed=1),
        peft_config=LoraConfig(r=Range(2, 6), **lora_rest),
        search=OptunaSearch(num_runs=2, metric="train_loss", seed=0),
    )
    rf.train()
    trials = _study(tmp_path / "rf").get_trials()
    assert len(trials) == 2
    for trial in trials:
        run = trial.user_attrs["run"]
        r = trial.params["peft_config.r"]  # an integer parameter: r is an int field
        assert type(r) is int and 2 <= r <= 6
        result = next(x for x in rf.runs if x.name == run)
        assert result.knobs == {"peft_config.r": r}
        ref = SFTTrainer(model=tiny_model_path(),
                         args=SFTConfig(output_dir=str(tmp_path / f"ref-{run}"), learning_rate=1e-3,
                                        **{k: v for k, v in base.items() if k != "num_chunks"}),
                         train_dataset=make_sft_dataset(16, seed=1),
                         peft_config=LoraConfig(r=r, **lora_rest))
        ref.train()
        ref.save_model(str(tmp_path / f"ref-{run}" / "final"))
        _assert_same_adapter(tmp_path / "rf" / "runs" / run / "final",
                             tmp_path / f"ref-{run}" / "final", run)
