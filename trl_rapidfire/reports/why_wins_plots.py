"""The report's "why a config wins" figures: the runs' knobs as parallel coordinates coloured
by the objective, beside each knob's importance for it (``why_wins.png``), and for two
objectives, the runs in the plane of both with their Pareto front (``pareto.png``).

The numbers come from :mod:`.why_wins` (pure, shared with the browser panel); this module only
draws them, on figures with an Agg canvas of their own as :mod:`.plots` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..storage.csv_logs import printable
from .experiment_data import ExperimentData
from .plot_legend import short_values
from .plot_style import RunStyle
from .report import short_name
from .top_runs import draw_end_labels, place_end_labels
from .why_wins import importance_method, knob_importance, parallel_axes, pareto_front

__all__ = ["WhyWins", "figure_text", "metric_mode", "pareto_figure", "why_wins", "why_wins_figure"]

# Axes of knobs drawn at most, the most important first: past 8 the axes crowd the figure
# and the rest explain little (the summary's table lists every knob's importance).
_MAX_AXES = 8
# Categories named on an axis at most; more are marked by ticks only (every other name).
_MAX_NAMES = 12
_NAME_CHARS = 16
_DPI = 110
# Runs on the Pareto front named beside their points at most (the summary lists them all).
_MAX_FRONT_NAMES = 15
_FRONT = "#960000"


@dataclass(frozen=True)
class WhyWins:
    """What the report found on why a config wins.

    Attributes:
        key: the objective (a logged metric key); ``mode``: ``min`` or ``max``.
        runs: the runs with an objective value, in run order.
        importance: ``(knob, share)`` largest first (see :func:`.why_wins.knob_importance`).
        method: how importance was measured (:func:`.why_wins.importance_method`).
        second, second_mode: the second objective of a Pareto front, if one was asked for.
        front: the runs on the front of ``key`` and ``second``, by ``key``'s value.
    """

    key: str
    mode: str
    runs: tuple[str, ...]
    importance: tuple[tuple[str, float], ...]
    method: str
    second: str | None = None
    second_mode: str | None = None
    front: tuple[str, ...] = ()


def metric_mode(key: str) -> str:
    """``min`` for a key ending in ``loss``, else ``max`` (the ranking's rule)."""
    return "min" if key.endswith("loss") else "max"


def _objective(data: ExperimentData, key: str) -> tuple[list[str], list[dict[str, Any]],
                                                        list[float]]:
    runs = [run for run in data.runs.values() if run.latest(key) is not None]
    return ([run.name for run in runs], [run.knobs for run in runs],
            [float(run.latest(key) or 0.0) for run in runs])


def why_wins(data: ExperimentData, key: str, second: str | None = None,
             mode: str | None = None) -> WhyWins:
    """Knob importance for ``key`` over the runs that logged it and, with ``second``, the
    Pareto front of the runs that logged both (``mode``: ``key``'s, the experiment's ranking
    metric's; else, and for ``second``, by :func:`metric_mode`)."""
    names, knobs, values = _objective(data, key)
    mode = mode or metric_mode(key)
    importance = tuple(knob_importance(knobs, values, mode=mode))
    front: tuple[str, ...] = ()
    if second:
        both = [r for r in data.runs.values()
                if r.latest(key) is not None and r.latest(second) is not None]
        points = [(float(r.latest(key) or 0.0), float(r.latest(second) or 0.0)) for r in both]
        front = tuple(both[i].name for i in pareto_front(points, (mode, metric_mode(second))))
    return WhyWins(key, mode, tuple(names), importance, importance_method(), second,
                   metric_mode(second) if second else None, front)


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_text(text: str) -> str:
    """Outside text (a knob's name or value) as a figure shows it literally: control and bidi
    characters escaped, ``$`` not starting matplotlib's math mode."""
    return printable(text).replace("$", r"\$")


def _cut(text: str) -> str:
    text = text if len(text) <= _NAME_CHARS else text[:_NAME_CHARS - 1] + "\N{HORIZONTAL ELLIPSIS}"
    return figure_text(text)


def _axis_ticks(axis: dict[str, Any]) -> list[tuple[float, str]]:
    """(position in [0, 1], label) of one parallel axis's ticks."""
    if axis["kind"] == "category":
        names, _ = short_values(axis["categories"])
        count = len(names)
        every = 1 if count <= _MAX_NAMES else -(-count // _MAX_NAMES)
        return [(i / (count - 1), _cut(name) if i % every == 0 else "")
                for i, name in enumerate(names)]
    low, high = axis["range"]
    if axis["kind"] == "log":
        lo, hi = np.log10(low), np.log10(high)
        decades = np.arange(np.ceil(lo), np.floor(hi) + 1)
        ticks = [10.0 ** d for d in decades] if len(decades) >= 2 else [low, high]
        return [((np.log10(t) - lo) / (hi - lo), f"{t:.0e}") for t in ticks]
    ticks = [t for t in MaxNLocator(5).tick_values(low, high) if low <= t <= high]
    return [((t - low) / (high - low), f"{t:.4g}") for t in ticks]


def _draw_parallel(ax: Any, why: WhyWins, data: ExperimentData, fig: Figure) -> None:
    names, knobs, values = _objective(data, why.key)
    order = [k for k, _ in why.importance][:_MAX_AXES]
    axes = {a["name"]: a for a in parallel_axes(knobs)}
    shown = [axes[k] for k in order if k in axes]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    columns = [a["positions"] for a in shown] + [[(v - low) / span for v in values]]
    xs: np.ndarray = np.arange(len(columns), dtype=float)
    lines = np.array([[(x, col[i]) for x, col in zip(xs, columns)] for i in range(len(names))])
    # The best runs drawn last (on top), in the colour map's strongest end.
    best_last = sorted(range(len(values)), key=lambda i: values[i],
                       reverse=why.mode == "min")
    # The best runs dark (they are drawn on top), the worst light.
    cmap = colormaps["viridis" if why.mode == "min" else "viridis_r"]
    norm = Normalize(low, high if high > low else low + 1.0)
    collection = LineCollection(lines[best_last], colors=cmap(norm(np.array(values)[best_last])),
                                linewidths=0.9, alpha=0.55 if len(values) > 50 else 0.85,
                                gid="parallel-lines")
    ax.add_collection(collection)
    for x, axis in zip(xs, shown):
        ax.axvline(x, color="0.25", linewidth=0.8, zorder=3)
        for y, text in _axis_ticks(axis):
            ax.plot([x - 0.03, x], [y, y], color="0.25", linewidth=0.8, zorder=3)
            if text:
                ax.text(x + 0.04, y, text, fontsize=7, va="center", ha="left", zorder=4,
                        bbox={"boxstyle": "round,pad=0.1", "facecolor": "white",
                              "edgecolor": "none", "alpha": 0.7})
    ax.axvline(xs[-1], color="0.25", linewidth=0.8, zorder=3)
    ax.set_xticks(xs, [f"{_cut(short_name(a['name']))}\n({a['kind']})" for a in shown]
                  + [f"{figure_text(why.key)}\n(objective)"], fontsize=8)
    ax.set_xlim(-0.15, xs[-1] + 0.6)
    ax.set_ylim(-0.04, 1.04)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    bar = fig.colorbar(ScalarMappable(norm, cmap), ax=ax, pad=0.01, fraction=0.04)
    bar.set_label(f"{figure_text(why.key)} ({why.mode} is best)", fontsize=8)
    ax.set_title(f"{len(names)} runs, each a line through its knobs (the most important "
                 "first) to its objective", fontsize=9)


def _draw_importance(ax: Any, why: WhyWins) -> None:
    items = list(why.importance)[::-1]  # largest at the top
    ys = np.arange(len(items))
    ax.barh(ys, [v for _, v in items], color="#1f77b4", gid="importance-bars")
    ax.set_yticks(ys, [_cut(short_name(k)) for k, _ in items], fontsize=8)
    for y, (_, v) in zip(ys, items):
        ax.text(v, y, f" {v:.0%}", va="center", ha="left", fontsize=7)
    ax.set_xlim(0, 1.15)
    ax.set_xlabel(f"share of importance\n{why.method}", fontsize=7)
    ax.set_title(f"knob importance for {figure_text(why.key)}", fontsize=9)


def why_wins_figure(data: ExperimentData, why: WhyWins) -> Figure:
    """The figure of ``why_wins.png``: the parallel coordinates (knobs by importance, numeric
    ones on their linear or log scale, categorical ones as evenly spaced categories, the
    objective last; each run a line in the colour of its objective, the best on top) and a
    bar per knob of its share of importance."""
    axes_count = min(len(why.importance), _MAX_AXES) + 1
    fig = _new_figure(max(7.0, 1.5 * axes_count + 4.0), 4.8)
    if not why.runs or not why.importance:
        ax = fig.subplots()
        ax.text(0.5, 0.5, f"no knob differs between runs that logged {figure_text(why.key)}"
                if why.runs else f"no run logged {figure_text(why.key)}", ha="center", va="center",
                transform=ax.transAxes, color="gray")
        ax.set_axis_off()
        return fig
    left, right = fig.subplots(1, 2, width_ratios=[3.2, 1.0])
    _draw_parallel(left, why, data, fig)
    _draw_importance(right, why)
    fig.suptitle(f"{figure_text(data.name)}: why a config wins ({figure_text(why.key)})")
    return fig


def pareto_figure(data: ExperimentData, why: WhyWins) -> Figure:
    """The figure of ``pareto.png``: each run that logged both objectives a point, the ones on
    the Pareto front joined in their order and named (the first 15), the rest grey."""
    assert why.second is not None and why.second_mode is not None
    fig = _new_figure(7.5, 5.0)
    ax = fig.subplots()
    runs = {r.name: (r.latest(why.key), r.latest(why.second)) for r in data.runs.values()}
    points = {n: (float(a), float(b)) for n, (a, b) in runs.items()
              if a is not None and b is not None}
    rest = [p for n, p in points.items() if n not in set(why.front)]
    if rest:
        ax.scatter([x for x, _ in rest], [y for _, y in rest], s=14, color="0.7",
                   label=f"{len(rest)} other runs", gid="pareto-others", zorder=2)
    if why.front:
        front = [points[n] for n in why.front]
        # The front's edge: what no run beats, a staircase where both modes agree.
        steps = {("min", "min"): "steps-post", ("max", "max"): "steps-pre"}
        ax.plot([x for x, _ in front], [y for _, y in front], color=_FRONT, linewidth=1.0,
                zorder=3,
                drawstyle=steps.get((why.mode, why.second_mode), "default"))
        ax.scatter([x for x, _ in front], [y for _, y in front], s=30, color=_FRONT, zorder=4,
                   gid="pareto-front",
                   label=f"Pareto front ({len(front)} runs)")
        # Named right of the axes, joined to their points, spread so that no two overlap.
        named = why.front[:_MAX_FRONT_NAMES]
        labels = draw_end_labels(ax, {n: points[n] for n in named}, {n: n for n in named},
                                 dict.fromkeys(named, RunStyle(_FRONT, "-", "", "")))
        place_end_labels(fig, labels)
    ax.set_xlabel(f"{figure_text(why.key)} ({why.mode} is best)")
    ax.set_ylabel(f"{figure_text(why.second)} ({why.second_mode} is best)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    ax.set_title(f"{figure_text(data.name)}: {figure_text(why.key)} against "
                 f"{figure_text(why.second)}", fontsize=10)
    return fig
