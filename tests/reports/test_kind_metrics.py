"""Every table of runs shows the trainer kind's own metric beside the losses, found in what the
runs logged: a reward model's accuracy, a policy's reward, a preference margin."""

from __future__ import annotations

from trl_rapidfire.reports.kind_metrics import kind_columns
from trl_rapidfire.reports.report import results_table
from trl_rapidfire.reports.results import RunResult
from trl_rapidfire.shared_state.runs import RunStatus


def _run(name, **metrics):
    return RunResult(name=name, knobs={"learning_rate": 1e-3}, status=RunStatus.COMPLETED,
                     global_step=4, output_dir=f"/tmp/{name}", metrics=metrics)


def test_the_eval_form_is_shown_when_runs_were_evaluated():
    assert kind_columns([{"loss": 1.0, "accuracy": 0.5}]) == {"accuracy": "accuracy"}
    assert kind_columns([{"accuracy": 0.5}, {"accuracy": 0.7, "eval_accuracy": 0.6}]) == \
        {"eval_accuracy": "eval_accuracy"}
    assert kind_columns([{"reward": 0.3, "rewards/margins": 0.1}]) == {"reward": "reward"}
    assert kind_columns([{"eval_rewards/margins": 0.2}]) == \
        {"eval_margins": "eval_rewards/margins"}
    assert kind_columns([{"loss": 1.0, "mean_token_accuracy": 0.4}]) == {}  # SFT: losses only


def test_a_table_of_reward_models_shows_their_accuracy():
    runs = [_run("run-0", loss=0.69, eval_loss=0.68, eval_accuracy=0.75),
            _run("run-1", loss=0.70, eval_loss=0.71, eval_accuracy=0.25)]
    header, rule, first, second = results_table(runs).splitlines()[:4]
    assert header.split()[:6] == ["run", "status", "steps", "loss", "train_loss", "eval_loss"]
    assert header.split()[6] == "eval_accuracy"
    assert first.split()[6] == "0.75" and second.split()[6] == "0.25"
    plain = results_table([_run("run-0", loss=0.5, eval_loss=0.4)]).splitlines()[0]
    assert "accuracy" not in plain
