"""The notebook panel lists its runs best first by the experiment's ranking metric (the
trainer's ``ranking``; without one, eval loss where every run has one, else the loss), as the
browser panel, ``status`` and the live table do, and moves a row when its run's rank moves.
Driven through the widgets' own API against a trainer that only implements the panel's
PanelTrainer (as tests/reports/test_notebook_table.py)."""

from __future__ import annotations

import pytest

from trl_rapidfire.reports.ranking import RankingMetric
from trl_rapidfire.reports.results import RunResult
from trl_rapidfire.shared_state.runs import RunStatus

pytest.importorskip("ipywidgets")

from tests.reports.test_notebook_panel import FakeTrainer  # noqa: E402 - after the skip


class RankedTrainer(FakeTrainer):
    """Four runs ranked by eval_accuracy, higher first."""

    ranking = RankingMetric("eval_accuracy", True, "metric_for_best_model")

    def __init__(self) -> None:
        super().__init__()
        self.runs = [RunResult(f"run-{i}", {"learning_rate": 10.0 ** -(i + 2)},
                               RunStatus.RUNNING, 4, f"out/run-{i}",
                               {"loss": 1.0 + i, **({"eval_accuracy": acc} if acc else {})})
                     for i, acc in enumerate([0.5, None, 0.9, 0.7])]

    def metric_history(self, run, key="loss"):
        return [(1, 2.0)]


def _order(panel) -> list[str]:
    by_widget = {row.widget: name for name, row in panel.rows.items()}
    return [by_widget[w] for w in panel.table._body.children if w in by_widget]


def test_the_rows_are_best_first_by_the_ranking_metric_and_move_with_it():
    from trl_rapidfire.reports.notebook_panel import NotebookPanel

    trainer = RankedTrainer()
    panel = NotebookPanel(trainer, poll=False)
    try:
        assert _order(panel) == ["run-2", "run-3", "run-0", "run-1"]  # none last
        assert panel.table.shown == ["run-2", "run-3", "run-0", "run-1"]
        trainer.runs[0].metrics["eval_accuracy"] = 0.95  # run-0 overtakes every run
        trainer.runs[0].global_step = 5  # a change the panel redraws for
        panel.refresh()
        assert _order(panel) == ["run-0", "run-2", "run-3", "run-1"]
    finally:
        panel.close()


def test_the_curves_colour_the_best_by_the_ranking_metric_not_by_loss():
    from trl_rapidfire.reports.notebook_curves import loss_figure

    # run-0's loss is the lowest; by eval_accuracy (higher first) run-2 is the best.
    curves = {f"run-{i}": [(1, 2.0 + i), (2, 1.0 + i)] for i in range(4)}
    coloured = {line.get_color() for line in loss_figure(curves, k=1, top=["run-2"])
                .axes[0].lines}
    by_loss = {line.get_color() for line in loss_figure(curves, k=1).axes[0].lines}
    # One coloured line each, and they are different runs' colours.
    assert len(coloured) == 2 and len(by_loss) == 2 and coloured != by_loss
    labels = [t.get_text().strip() for t in loss_figure(curves, k=1, top=["run-2"]).axes[0].texts]
    assert labels == ["run-2"]
