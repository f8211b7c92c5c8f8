"""The report at 100 runs: the best 10 by the objective in colour and labelled at their
curves' ends without overlapping, the others thin and grey, no wall of legend; the "why a
config wins" figures and summary from an experiment folder with two metrics. The runs are
the synthetic ones of ``benchmarks/report_scale.py`` (which times the report at 100 and 500)."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest
from matplotlib.collections import LineCollection
from matplotlib.text import Text

from trl_rapidfire.reports.plots import (
    learning_curves_figure,
    load_experiment,
    rank_runs,
    schedule_figure,
    write_report,
)
from trl_rapidfire.reports.top_runs import GREY, MANY_RUNS, TOP_K, spread
from trl_rapidfire.reports.why_wins import pareto_front
from trl_rapidfire.reports.why_wins_plots import why_wins, why_wins_figure

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "report_scale.py"
_spec = importlib.util.spec_from_file_location("report_scale", _SCRIPT)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def hundred():
    return bench.synthetic_runs(100)


def _labels(ax):
    return [t for t in ax.texts if str(t.get_gid()).startswith("top-label:")]


def test_a_hundred_runs_the_best_ten_in_colour_labelled_at_their_ends(hundred):
    ranking = [r.name for r in rank_runs(hundred, "eval_loss")]
    fig, counts = learning_curves_figure(hundred, "eval_loss", label_knobs=["learning_rate"])
    assert counts == {"loss": 100, "eval_loss": 100}
    fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")  # the layout as saved
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_title() in ("loss (training)", "eval_loss")]
    assert len(panels) == 2
    for ax in panels:
        coloured = [line for line in ax.get_lines()
                    if str(line.get_gid()).startswith("curve:")]
        assert sorted(line.get_gid()[6:] for line in coloured) == sorted(ranking[:TOP_K])
        assert len({line.get_color() for line in coloured}) == TOP_K  # one colour each
        grey = [c for c in ax.collections if c.get_gid() == "grey-curves"]
        assert len(grey) == 1 and isinstance(grey[0], LineCollection)
        assert len(grey[0].get_segments()) == 100 - TOP_K
        assert grey[0].get_linewidth()[0] < min(line.get_linewidth() for line in coloured)

        labels = _labels(ax)
        assert sorted(t.get_gid()[10:] for t in labels) == sorted(ranking[:TOP_K])
        # Each label's colour is its run's, its text starts with its rank.
        colours = {line.get_gid()[6:]: line.get_color() for line in coloured}
        for label in labels:
            run = label.get_gid()[10:]
            assert label.get_color() == colours[run]
            assert label.get_text().startswith(f"#{ranking.index(run) + 1} {run}")
        # No two overlap: their heights at least a line of their font apart, their boxes
        # apart, all inside the figure and right of the panel's axes (the text's box: an
        # annotation's own takes in its leader line).
        boxes = sorted((Text.get_window_extent(t, renderer) for t in labels),
                       key=lambda b: b.y0)
        height = labels[0].get_fontsize() * fig.dpi / 72
        for below, above in zip(boxes, boxes[1:]):
            assert (above.y0 + above.y1) / 2 - (below.y0 + below.y1) / 2 >= height
            assert above.y0 >= below.y1
        frame = ax.get_window_extent(renderer)
        for box in boxes:
            assert box.x0 >= frame.x1 and box.x1 <= fig.bbox.x1 + 1
            assert frame.y0 - 1 <= box.y0 and box.y1 <= frame.y1 + 1
    # Knobs named in the metric's panel only (the first by importance), the rank and name in
    # the loss panel.
    texts = {t.get_gid(): t.get_text() for t in _labels(panels[1])}
    assert all("lr=" in text for text in texts.values())
    assert all("lr=" not in t.get_text() for t in _labels(panels[0]))
    # The legend: two lines (the coloured runs, the grey ones), not one per run.
    legend = next(lg for lg in fig.legends if lg.get_title().get_text() == "runs")
    assert [t.get_text() for t in legend.get_texts()] == [
        "the best 10 by eval_loss\n(labelled at their ends)", "90 other runs"]
    assert legend.get_window_extent(renderer).width < 0.2 * fig.bbox.width
    # Only the coloured runs' ops are marked (90 stops of grey runs would hide them).
    marked = {str(a.get_gid()) for ax in panels for a in ax.get_children()}
    assert not any(f"op:{run}:" in gid for gid in marked for run in ranking[TOP_K:])


def test_the_schedule_of_a_hundred_runs_names_only_the_coloured_ones(hundred):
    ranking = [r.name for r in rank_runs(hundred, "eval_loss")]
    fig, bars = schedule_figure(hundred, ranking=ranking)
    assert bars == len(hundred.schedule)
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [
        *(f"#{i + 1} {n}" for i, n in enumerate(ranking[:TOP_K])), "90 other runs"]
    patches = fig.axes[0].patches
    grey = [p for p in patches if p.get_gid().split(":")[1] not in ranking[:TOP_K]]
    assert grey and all(p.get_facecolor()[:3] == pytest.approx(
        tuple(int(GREY[i:i + 2], 16) / 255 for i in (1, 3, 5))) for p in grey)


def test_up_to_twenty_runs_each_has_its_own_legend_line(hundred):
    few = bench.synthetic_runs(MANY_RUNS)
    fig, _ = learning_curves_figure(few, "eval_loss")
    legend = next(lg for lg in fig.legends if lg.get_title().get_text() == "runs")
    assert len(legend.get_texts()) == MANY_RUNS
    assert not any(_labels(ax) for ax in fig.axes)


def test_spread_keeps_labels_apart_and_in_their_order():
    assert spread([5.0, 5.0, 5.0], 2.0, 0.0, 100.0) == [5.0, 7.0, 9.0]
    assert spread([99.0, 98.0], 2.0, 0.0, 100.0) == [100.0, 98.0]  # pushed down at the top
    assert spread([1.0, 50.0], 2.0, 10.0, 100.0) == [10.0, 50.0]
    assert spread([0.0] * 4, 5.0, 0.0, 10.0) == [0.0, 5.0, 10.0, 15.0]  # too many: upward


def test_why_a_config_wins_from_an_experiment_folder_with_two_metrics(tmp_path):
    # 40 runs: past the 20 of a legend, and half the time of 100 to write and read back.
    bench.write_experiment(bench.synthetic_runs(40), tmp_path / "exp")
    files = write_report(tmp_path / "exp", tmp_path / "report", metric="eval_loss,accuracy",
                         tracking_uri=f"sqlite:///{tmp_path / 'none.db'}")
    assert files.why_wins is not None and files.pareto is not None
    assert [p.name for p in files.paths] == ["learning_curves.png", "schedule.png",
                                            "summary.md", "why_wins.png", "pareto.png"]
    for path in files.paths[:2] + files.paths[3:]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    why = files.why
    assert why is not None and why.key == "eval_loss" and why.second == "eval_accuracy"
    assert why.importance[0][0] == "learning_rate" and why.importance[0][1] > 0.5
    # The front as a hand count of who is beaten in both (min loss, max accuracy).
    data = load_experiment(tmp_path / "exp", metric="eval_loss,accuracy",
                           tracking_uri=f"sqlite:///{tmp_path / 'none.db'}")
    points = {r.name: (r.latest("eval_loss"), r.latest("eval_accuracy"))
              for r in data.runs.values()}
    unbeaten = {n for n, (a, b) in points.items() if not any(
        a2 <= a and b2 >= b and (a2, b2) != (a, b) for a2, b2 in points.values())}
    assert set(why.front) == unbeaten and len(unbeaten) >= 3
    names = list(points)
    assert list(why.front) == [names[i] for i in pareto_front(list(points.values()),
                                                               ("min", "max"))]
    summary = files.summary.read_text()
    assert "## Why a config wins" in summary and "| learning_rate |" in summary
    assert why.method in summary and ", ".join(why.front) in summary
    assert "![Why wins](why_wins.png)" in summary and "![Pareto](pareto.png)" in summary
    # One metric: no Pareto front, the importance still.
    one = write_report(tmp_path / "exp", tmp_path / "one", metric="eval_loss",
                       tracking_uri=f"sqlite:///{tmp_path / 'none.db'}")
    assert one.pareto is None and one.why_wins is not None
    assert not (tmp_path / "one" / "pareto.png").exists()
    with pytest.raises(ValueError, match="two"):
        write_report(tmp_path / "exp", tmp_path / "bad", metric="a,b,c")


def test_the_parallel_coordinates_have_an_axis_per_knob_and_one_for_the_objective(hundred):
    why = why_wins(hundred, "eval_loss")
    fig = why_wins_figure(hundred, why)
    parallel = fig.axes[0]
    bars = next(ax for ax in fig.axes if ax.get_title().startswith("knob importance"))
    labels = [t.get_text().split("\n") for t in parallel.get_xticklabels()]
    assert [line[0] for line in labels] == [
        {"learning_rate": "lr", "lr_scheduler_type": "sched", "peft_config": "peft",
         "per_device_train_batch_size": "batch", "warmup_ratio": "warmup_ratio"}[k]
        for k, _ in why.importance] + ["eval_loss"]
    kinds = dict(zip((k for k, _ in why.importance), (line[1] for line in labels)))
    assert kinds["learning_rate"] == "(log)" and kinds["lr_scheduler_type"] == "(category)"
    assert kinds["per_device_train_batch_size"] == "(linear)"
    lines = next(c for c in parallel.collections if c.get_gid() == "parallel-lines")
    assert len(lines.get_segments()) == 100
    assert len(bars.patches) == len(why.importance)


def test_outside_text_in_knobs_is_drawn_literally(hundred):
    # A knob's name and value are the user's: "$" must not start matplotlib's math mode (an
    # unbalanced one would fail the drawing), a control character is shown escaped.
    runs = dict(list(hundred.runs.items())[:25])
    for i, run in enumerate(runs.values()):
        run.knobs = {**run.knobs, "te$t": f"v{i % 3}\x1b$\\frac"}
    data = type(hundred)(hundred.output_dir, "odd", runs, [], [], "disk", "d")
    fig, _ = learning_curves_figure(data, "eval_loss", label_knobs=["te$t"])
    fig.savefig(io.BytesIO(), format="png")
    texts = [t.get_text() for ax in fig.axes for t in _labels(ax)]
    assert any("te\\$t=v" in t and "\\x1b" in t for t in texts), texts
    why = why_wins(data, "eval_loss")
    why_wins_figure(data, why).savefig(io.BytesIO(), format="png")
