"""The experiment's one ranking metric (``reports/ranking.py``): chosen from the policy, the
config and the search in that order, recorded as text and read back (text from outside:
anything else is no ranking), and ranking runs best first with the runs without a value last.
``pick_best`` and the live runs table rank by it."""

from __future__ import annotations

import io

import pytest
from terminal import screen

from trl_rapidfire import Budget, Hyperband, SuccessiveHalving
from trl_rapidfire.reports.progress import ExperimentProgress, runs_table
from trl_rapidfire.reports.ranking import (
    RankingMetric,
    choose_ranking,
    default_ranking,
    read_ranking,
    recorded_ranking,
    write_ranking,
)
from trl_rapidfire.reports.results import RunResult, pick_best
from trl_rapidfire.shared_state.runs import RunStatus


def test_the_policys_metric_comes_first_then_the_config_then_the_search():
    policy = SuccessiveHalving(metric="eval_accuracy", mode="max")
    chosen = choose_ranking(policy=policy, metric_for_best_model="eval_loss",
                            objective=("eval_bleu", True), evaluated=True)
    assert (chosen.key, chosen.mode, chosen.source, chosen.by) == (
        "eval_accuracy", "max", "policy", "SuccessiveHalving")
    assert chosen.describe() == ("eval_accuracy (higher is better; SuccessiveHalving's "
                                 "metric)")
    # Several policies: the first that judges by a metric (a Budget has none).
    both = [Budget(max_total_steps=10), Hyperband(metric="loss", mode="min")]
    from trl_rapidfire.control.policies import as_policy

    assert choose_ranking(policy=as_policy(both)).key == "loss"
    assert choose_ranking(policy=as_policy(both)).by == "Hyperband"
    # No policy: metric_for_best_model (``accuracy`` also finds ``eval_accuracy``).
    config = choose_ranking(policy=Budget(max_total_steps=10),
                            metric_for_best_model="accuracy", objective=("x", False))
    assert (config.key, config.mode, config.source) == ("accuracy", "max",
                                                        "metric_for_best_model")
    assert config.keys == ("accuracy", "eval_accuracy")
    assert choose_ranking(metric_for_best_model="eval_loss").mode == "min"
    assert choose_ranking(metric_for_best_model="eval_loss", greater_is_better=True).mode \
        == "max"
    # Then the search's objective, then eval_loss where the runs are evaluated, else loss.
    search = choose_ranking(objective=("eval_bleu", True), search="OptunaSearch")
    assert (search.key, search.mode, search.source, search.by) == (
        "eval_bleu", "max", "search", "OptunaSearch")
    assert choose_ranking(evaluated=True) == RankingMetric("eval_loss")
    assert choose_ranking() == RankingMetric("loss")


def test_recorded_as_text_and_read_back_only_when_it_is_one(tmp_path):
    ranking = RankingMetric("eval_accuracy", True, "policy", "SuccessiveHalving")
    assert RankingMetric.from_text(ranking.to_text()) == ranking
    for bad in (None, "", "nope", "[1]", '{"metric": "x", "mode": "up"}', '{"mode": "min"}',
                '{"metric": "", "mode": "min"}', "{" * 5000, '{"metric": 3, "mode": "max"}'):
        assert RankingMetric.from_text(bad) is None, bad
    # The tag most runs carry (a clone may carry none).
    other = RankingMetric("loss")
    tags = [{"rapidfire.ranking": ranking.to_text()}] * 3 + [
        {"rapidfire.ranking": other.to_text()}, {}]
    assert recorded_ranking(tags) == ranking
    assert recorded_ranking([{}, {"rapidfire.ranking": "junk"}]) is None
    # In the experiment's folder.
    assert read_ranking(tmp_path) is None
    write_ranking(tmp_path, ranking)
    assert read_ranking(tmp_path) == ranking
    (tmp_path / ".rapidfire" / "ranking.json").write_text("not json")
    assert read_ranking(tmp_path) is None


def _run(i: int, status: RunStatus, **metrics: float) -> RunResult:
    return RunResult(f"run-{i}", {"learning_rate": 10.0 ** -i}, status, 10 * i,
                     f"out/runs/run-{i}", dict(metrics))


def test_best_first_puts_runs_without_a_value_last_in_run_order():
    runs = [_run(0, RunStatus.RUNNING), _run(1, RunStatus.RUNNING, eval_accuracy=0.5),
            _run(2, RunStatus.RUNNING, accuracy=0.9), _run(3, RunStatus.RUNNING),
            _run(4, RunStatus.RUNNING, eval_accuracy=float("nan")),
            _run(5, RunStatus.RUNNING, eval_accuracy=0.7)]
    higher = RankingMetric("accuracy", True)
    # `accuracy` also finds `eval_accuracy`; NaN is no value.
    assert [r.name for r in higher.best_first(runs, lambda r: r.metrics)] == [
        "run-2", "run-5", "run-1", "run-0", "run-3", "run-4"]
    assert default_ranking([{"loss": 1.0, "eval_loss": 2.0}, {}]).key == "eval_loss"
    assert default_ranking([{"loss": 1.0, "eval_loss": 2.0}, {"loss": 1.0}]).key == "loss"


def test_pick_best_ranks_by_the_experiments_metric():
    runs = [_run(0, RunStatus.COMPLETED, loss=0.1, eval_loss=0.9, eval_accuracy=0.2),
            _run(1, RunStatus.COMPLETED, loss=0.5, eval_loss=0.4, eval_accuracy=0.6),
            _run(2, RunStatus.COMPLETED, loss=0.9, eval_loss=0.5, eval_accuracy=0.7)]
    assert pick_best(runs).name == "run-1"  # eval_loss: every run has one
    assert pick_best(runs, ranking=RankingMetric("eval_accuracy", True)).name == "run-2"
    assert pick_best(runs, ranking=RankingMetric("loss")).name == "run-0"
    # None evaluated yet: the training loss decides, not the first run.
    fresh = [_run(0, RunStatus.RUNNING, loss=0.9), _run(1, RunStatus.RUNNING, loss=0.3)]
    assert pick_best(fresh, ranking=RankingMetric("eval_loss")).name == "run-1"


def test_the_live_table_shows_the_running_runs_and_the_best_first_and_what_it_left_out():
    # 46 runs stopped early (the losers, run order first), 10 running, 4 completed winners.
    runs = ([_run(i, RunStatus.STOPPED, loss=2.0, eval_loss=3.0 + i / 100) for i in range(46)]
            + [_run(i, RunStatus.RUNNING, loss=1.0, eval_loss=2.0 + i / 100)
               for i in range(46, 56)]
            + [_run(i, RunStatus.COMPLETED, loss=0.5, eval_loss=1.0 + (60 - i) / 100)
               for i in range(56, 60)])
    text = runs_table(runs, ranking=RankingMetric("eval_loss"), max_rows=20)
    names = [line.split()[0] for line in text.splitlines() if line.startswith("run-")]
    assert names[:10] == [f"run-{i}" for i in range(46, 56)]  # running, best first
    assert names[10:14] == ["run-59", "run-58", "run-57", "run-56"]  # then the winners
    assert len(names) == 19 and text.splitlines()[-1].startswith("(41 more runs")
    # In a terminal of 24 lines, the view leaves out what does not fit and says so.
    term = _Terminal()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TERM", "xterm-256color")
        mp.setenv("COLUMNS", "100")
        mp.setenv("LINES", "24")
        view = ExperimentProgress(60, stream=term, ranking=RankingMetric("eval_loss"))
        assert view.mode == "live"
        view.chunk_done(runs, 30)
        view.close()
    lines = screen(term.getvalue(), cols=100)
    shown = [line.split()[0] for line in lines if line.startswith("run-")]
    assert shown[:10] == [f"run-{i}" for i in range(46, 56)] and "run-59" in shown
    assert len(shown) == 24 - 4 - 1 and "run-45" not in shown  # the bar, head, rule, cursor
    assert any(line.startswith("(") and "more runs" in line for line in lines), lines


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True
