"""Runs told apart in the report's figures: 20 colours a person tells apart, the same colour for
a run in every figure and every report, colour and line style pairs unique past 20 runs, and
runs whose curves coincide still seen (cased, and named where they end on another curve)."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import to_rgb

from trl_rapidfire.reports.plot_style import PALETTE, run_style, run_styles
from trl_rapidfire.reports.plots import (
    ExperimentData,
    RunData,
    learning_curves_figure,
    schedule_figure,
)
from trl_rapidfire.storage.schedule import ChunkRecord

# Least CIE76 distance (Euclidean in CIELAB; about 2.3 is the least a person notices side by
# side) between any two colours of the first 10 runs and of the first 20. Curves are thin
# lines, seen apart, not patches side by side: they need much more. matplotlib's tab10 has two
# pairs under 30 (purple and pink, runs 4 and 6: 27.7), tab20 has pairs under 20 (its light
# and dark shades of a hue: 16.6), and the colours the report used to give 21 runs and more
# (turbo, evenly spaced) under 10.
FIRST_TEN = 30.0
FIRST_TWENTY = 20.0


def _lab(color) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour."""
    rgb = np.array(to_rgb(color))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124564, 0.3575761, 0.1804375],
                    [0.2126729, 0.7151522, 0.0721750],
                    [0.0193339, 0.1191920, 0.9503041]]) @ linear / [0.95047, 1.0, 1.08883]
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _least_distance(colors) -> float:
    labs = [_lab(c) for c in colors]
    return min(float(np.linalg.norm(a - b)) for a, b in itertools.combinations(labs, 2))


def _data(histories, schedule=()) -> ExperimentData:
    runs = {name: RunData(name, "completed", 30, {"seed": i}, history, "disk")
            for i, (name, history) in enumerate(histories.items())}
    return ExperimentData(Path("exp"), "exp", runs, list(schedule), [], "disk", "d")


def _fanning(names, steps=30):
    """Curves that start at one point and fan out (as runs from one model do)."""
    return {name: {"loss": [(s, 2.0 - s * 0.01 * (1 + i)) for s in range(1, steps + 1)]}
            for i, name in enumerate(names)}


def _curve(ax, run):
    return next(line for line in ax.get_lines() if line.get_gid() == f"curve:{run}")


def _bars(fig) -> dict[str, object]:
    """Run -> one of its bars in the schedule chart."""
    return {p.get_gid().split(":")[1]: p for p in fig.axes[0].patches
            if str(p.get_gid()).startswith("chunk:")}


def test_the_thresholds_fail_the_old_colours():
    assert _least_distance(matplotlib.colormaps["tab10"](range(10))) < FIRST_TEN
    assert _least_distance(matplotlib.colormaps["tab20"](range(20))) < FIRST_TWENTY
    turbo = matplotlib.colormaps["turbo"]
    assert _least_distance([turbo(0.05 + 0.9 * i / 20) for i in range(21)]) < FIRST_TWENTY


def test_twenty_runs_have_colours_far_apart_and_keep_them_in_every_figure():
    names = [f"run-{i}" for i in range(20)]
    chunks = [ChunkRecord(n, 0, 0, 0, i % 2, i, i + 1, 0, 1) for i, n in enumerate(names)]
    data = _data(_fanning(names), chunks)
    fig, _ = learning_curves_figure(data, None)
    colors = [_curve(fig.axes[0], n).get_color() for n in names]
    assert _least_distance(colors[:10]) >= FIRST_TEN
    assert _least_distance(colors) >= FIRST_TWENTY
    assert colors == list(PALETTE)
    # None is grey (a rejected op's cross is): every colour has a hue to tell it by.
    assert all(np.hypot(*_lab(c)[1:]) >= 25 for c in colors)

    # The schedule chart gives each run its curves' colour.
    bars = _bars(schedule_figure(data)[0])
    assert [to_rgb(bars[n].get_facecolor()) for n in names] == [to_rgb(c) for c in colors]

    # A run's colour comes from its index, not its place among the runs drawn: with run-0..6
    # deleted, run-7 keeps its colour (the first colour, as by place, would be run-0's).
    few = _data(_fanning(["run-7", "run-12"]))
    fig, _ = learning_curves_figure(few, None)
    assert _curve(fig.axes[0], "run-7").get_color() == colors[7]
    assert _curve(fig.axes[0], "run-12").get_color() == colors[12]


def test_runs_past_twenty_differ_from_the_first_twenty_in_colour_and_line_style():
    names = [f"run-{i}" for i in range(40)]
    styles = run_styles(names)
    pairs = [(styles[n].color, styles[n].linestyle) for n in names]
    assert len(set(pairs)) == 40
    for i in range(20):  # the same colour 20 runs later, never the same line style
        assert pairs[i][0] == pairs[i + 20][0] and pairs[i][1] != pairs[i + 20][1]
    # Unique up to 80 runs; and the first 20 never share both line style and marker.
    styles_80 = [run_style(i) for i in range(80)]
    assert len({(s.color, s.linestyle) for s in styles_80}) == 80
    assert len({(s.linestyle, s.marker) for s in styles_80[:20]}) == 20
    # Bars have no line style: the second 20 are hatched, the first 20 not.
    assert all(not styles[f"run-{i}"].hatch for i in range(20))
    assert all(styles[f"run-{i}"].hatch for i in range(20, 40))

    # A figure of more than 20 runs draws the best 10 in colour and the rest grey (see
    # test_report_many_runs.py): no two drawn runs share a colour there either.
    chunks = [ChunkRecord(n, 0, 0, 0, 0, i, i + 1, 0, 1) for i, n in enumerate(names)]
    fig, _ = learning_curves_figure(_data(_fanning(names), chunks), None)
    lines = [line for line in fig.axes[0].get_lines()
             if str(line.get_gid()).startswith("curve:")]
    assert len(lines) == 10 and len({line.get_color() for line in lines}) == 10


def test_equal_curves_are_cased_and_named_where_they_end_on_another():
    same = {"loss": [(s, 2.0 - s / 100) for s in range(1, 51)],
            "eval_loss": [(s, 2.2 - s / 100) for s in (10, 20, 30, 40, 50)]}
    early = {k: [(s, v) for s, v in points if s <= 25] for k, points in same.items()}
    other = {"loss": [(s, 2.0 - s / 40) for s in range(1, 51)],
             "eval_loss": [(s, 2.2 - s / 40) for s in (10, 20, 30, 40, 50)]}
    # run-0, run-4 and run-8 have the same line style (solid) and equal curves: drawn alike,
    # the last would hide the others but for their hollow point markers. run-2 lies on them
    # until it stops at step 25; run-1 starts where they do and falls away.
    data = _data({"run-0": same, "run-1": other, "run-2": early, "run-4": same, "run-8": same})
    assert {run_style(i).linestyle for i in (0, 4, 8)} == {"-"}
    fig, _ = learning_curves_figure(data, "eval_loss")
    for ax in fig.axes:
        width = {n: _curve(ax, n).get_linewidth() for n in data.runs}
        # Each drawn wider than the ones on it, so it shows on both sides of them.
        assert width["run-0"] > width["run-2"] > width["run-4"] > width["run-8"]
        assert width["run-1"] == width["run-8"]  # on no other: the usual width
        labels = {t.get_text() for t in ax.texts if str(t.get_gid()).startswith("end-label:")}
        assert labels == {"run-0, run-4, run-8", "run-2"}
    # The legend keys have the usual width: width means nothing but "another lies on it".
    legend = next(lg for lg in fig.legends if lg.get_title().get_text() == "runs")
    assert len({line.get_linewidth() for line in legend.get_lines()}) == 1


@pytest.mark.parametrize("count", [2, 20])
def test_curves_that_only_start_together_are_not_cased(count):
    # All runs start from one model, so their first losses coincide: no run is hidden.
    data = _data(_fanning([f"run-{i}" for i in range(count)]))
    fig, _ = learning_curves_figure(data, None)
    ax = fig.axes[0]
    assert {_curve(ax, n).get_linewidth() for n in data.runs} == {1.4}
    assert not [t for t in ax.texts if str(t.get_gid()).startswith("end-label:")]
