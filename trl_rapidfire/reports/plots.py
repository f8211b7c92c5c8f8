"""Reports of an experiment as figures: the runs' learning curves with the control ops marked
where they happened, the chunk schedule as a Gantt chart, and a markdown summary ranking the
runs.

Everything is read back from what an experiment leaves behind (see :mod:`.experiment_data`),
never from a live trainer, so a report can be drawn for a finished experiment, a running one,
or one copied from another machine.

Figures are drawn on matplotlib ``Figure`` objects with an Agg canvas of their own rather than
through ``pyplot``: nothing global (the backend, pyplot's figure registry) changes under a
caller who draws figures of their own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from .curve_overlap import CASING_STEP, casing, ends_on_others, near
from .experiment_data import (
    TRAIN_METRIC,
    ExperimentData,
    OpEvent,
    RunData,
    load_experiment,
    run_order,
    split_metrics,
)
from .op_marks import Marker, PlacedMarker, draw_markers, legend_entries, op_markers
from .plot_legend import fit_legends, legend_style, run_labels
from .plot_style import RunStyle
from .ranking import read_ranking
from .summary import (
    LEARNING_CURVES,
    PARETO,
    SCHEDULE,
    SUMMARY,
    WHY_WINS,
    rank_runs,
    summary_markdown,
)
from .top_runs import (
    GREY,
    GREY_WIDTH,
    MANY_RUNS,
    TOP_K,
    EndLabel,
    draw_end_labels,
    end_label_texts,
    highlight,
    place_end_labels,
)
from .why_wins_plots import WhyWins, pareto_figure, why_wins, why_wins_figure

# ExperimentData, OpEvent, RunData and load_experiment live in experiment_data.py, Marker and
# op_markers in op_marks.py, rank_runs and summary_markdown in summary.py; they are still
# imported from here, where the report's public API has always been.
__all__ = [
    "ExperimentData",
    "Marker",
    "OpEvent",
    "ReportFiles",
    "RunData",
    "learning_curves_figure",
    "load_experiment",
    "op_markers",
    "plot_learning_curves",
    "plot_schedule",
    "rank_runs",
    "resolve_metric",
    "schedule_figure",
    "summary_markdown",
    "write_report",
]

_DPI = 110
# A run's curve width where no other curve lies on it (see curve_overlap for where it is wider).
_LINE_WIDTH = 1.4
# An op marker's height as a fraction of a panel's span of values (8 points of some 250):
# markers at one step closer than that in y would cover each other (op_marks sets them side
# by side).
_MARKER_SPAN = 0.035
# Pixels a chunk's label keeps clear of its bar's sides (and top and bottom), so that labels
# of neighbouring bars never run into each other.
_LABEL_PAD = 4.0


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote, and what it drew (for checks).

    Attributes:
        learning_curves, schedule, summary: the files written.
        source, source_detail: where the metrics came from (see :class:`ExperimentData`).
        metric: the metric key the runs were ranked by (``None`` if no run logged it).
        curves: panel (metric key) -> number of run curves drawn in it.
        markers: the op markers, the rejected ops' included (``rejected``); past
            :data:`~.top_runs.MANY_RUNS` runs only the coloured runs' are drawn.
        ranking: run names, best first, as in the summary table.
        why_wins, pareto: the "why a config wins" figures (``None`` where not drawn: no
            metric; a Pareto front needs two).
        why: what they show (see :class:`~.why_wins_plots.WhyWins`).
    """

    learning_curves: Path
    schedule: Path
    summary: Path
    source: str
    source_detail: str
    metric: str | None
    curves: dict[str, int]
    markers: tuple[Marker, ...]
    ranking: tuple[str, ...]
    why_wins: Path | None = None
    pareto: Path | None = None
    why: WhyWins | None = None

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every file written."""
        extra = tuple(p for p in (self.why_wins, self.pareto) if p is not None)
        return (self.learning_curves, self.schedule, self.summary, *extra)


# ----------------------------------------------------------------------------- analysis


def resolve_metric(data: ExperimentData, metric: str) -> str | None:
    """The logged key for ``metric``: itself, else ``eval_<metric>`` (``accuracy`` names
    ``eval_accuracy``, as ``metric_for_best_model`` does); ``None`` if no run logged either."""
    for key in (metric, f"eval_{metric}"):
        if any(run.history.get(key) for run in data.runs.values()):
            return key
    return None


# ----------------------------------------------------------------------------- drawing


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _draw_curves(ax: Any, series: dict[str, tuple[np.ndarray, np.ndarray]],
                 styles: dict[str, RunStyle], names: Sequence[str], end_names: bool = True
                 ) -> None:
    """One curve per run of ``series`` (in run order, later ones on top), wider where later
    curves lie on it, and the names of the runs whose curves end on another's at their end
    (see :mod:`.curve_overlap`)."""
    tol = near(series)
    wider = casing(series, tol)
    for name, (xs, ys) in series.items():
        # Evaluations are a few points per run: a marker shows where each one was taken.
        # A dense curve gets about 10 markers spaced along it, started at a different
        # place run by run, so that the markers of equal curves fall apart.
        dense = len(xs) > 15
        start = (names.index(name) * 0.618) % 1.0 * 0.1
        ax.plot(xs, ys, linewidth=_LINE_WIDTH + CASING_STEP * wider[name], markersize=5,
                markerfacecolor="none", markevery=(start, 0.1) if dense else None,
                gid=f"curve:{name}", **styles[name].line())
    for end in ends_on_others(series, tol) if end_names else ():
        # Up and to the left of the end, inside the axes: the curves run left to right.
        text = ax.annotate(", ".join(end.runs), (end.x, end.y), xytext=(-6, 6),
                           textcoords="offset points", ha="right", va="bottom",
                           fontsize="x-small", color="0.15", zorder=7,
                           bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                                 "edgecolor": "none", "alpha": 0.75},
                           gid=f"end-label:{'+'.join(end.runs)}")
        text.set_in_layout(False)  # the axes' place must not depend on where curves end


def _series(data: ExperimentData, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    series = {}
    for run in data.runs.values():
        points = [(s, v) for s, v in run.history.get(key, []) if math.isfinite(v)]
        if points:
            series[run.name] = (np.array([s for s, _ in points], dtype=float),
                                np.array([v for _, v in points], dtype=float))
    return series


def _draw_grey(ax: Any, series: dict[str, tuple[np.ndarray, np.ndarray]],
               styles: dict[str, RunStyle]) -> None:
    # The runs not among the best: thin, under the coloured ones, one artist for them all
    # (500 lines as one collection draw in a fraction of the time).
    segments = [np.column_stack(xy) for xy in series.values()]
    if segments:
        ax.add_collection(LineCollection(segments, colors=next(iter(styles.values())).color,
                                         linewidths=GREY_WIDTH, alpha=0.6, zorder=1,
                                         gid="grey-curves"))
        ax.autoscale_view()


def learning_curves_figure(
    data: ExperimentData, metric: str | None, markers: Sequence[Marker] | None = None,
    *, ranking: Sequence[str] | None = None, top: int = TOP_K,
    label_knobs: Sequence[str] = (),
) -> tuple[Figure, dict[str, int]]:
    """The figure of ``learning_curves.png`` (see :func:`plot_learning_curves`), not saved,
    and panel (metric key) -> number of run curves drawn in it.

    Past :data:`~.top_runs.MANY_RUNS` runs, only the ``top`` best of ``ranking`` (default:
    :func:`rank_runs` by ``metric``, else by the training loss) are in colour, labelled at
    their curves' ends (with the first two of ``label_knobs``, the knobs by importance, that
    differ between them), with their ops marked; the others are thin and grey."""
    markers = op_markers(data, rejected=True) if markers is None else markers
    panels = [TRAIN_METRIC] + ([metric] if metric and metric != TRAIN_METRIC else [])
    names = list(data.runs)
    if ranking is None:
        ranking = [r.name for r in rank_runs(data, metric or TRAIN_METRIC)]
    styles, coloured = highlight(names, ranking, top)
    many = len(names) > MANY_RUNS
    if many:
        markers = [m for m in markers if m.run in set(coloured)]
    axes_width = 5.2 * len(panels)
    fig = _new_figure(axes_width + 3.0, 4.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    counts: dict[str, int] = {}
    drawn: dict[str, None] = {}  # the runs with a curve in any panel, in run order
    end_labels: list[EndLabel] = []
    for ax, key in zip(axes, panels):
        series = _series(data, key)
        shown = {n: series[n] for n in names if n in series and n in set(coloured)}
        if many:
            _draw_grey(ax, {n: xy for n, xy in series.items() if n not in shown},
                       {n: styles[n] for n in series if n not in shown})
            # Best on top: the coloured runs drawn worst first.
            ordered = {n: shown[n] for n in reversed(coloured) if n in shown}
            _draw_curves(ax, ordered, styles, names, end_names=False)
            label_texts = end_label_texts([data.runs[n] for n in coloured],
                                          knobs=key == panels[-1], order=label_knobs)
            end_labels += draw_end_labels(ax, {n: (float(xy[0][-1]), float(xy[1][-1]))
                                               for n, xy in ordered.items()}, label_texts,
                                          styles)
        else:
            _draw_curves(ax, series, styles, names)
        # In the order the ops were handled, which is the order side by side.
        draw_markers(ax, [PlacedMarker(m, m.step, float(np.interp(m.step, *series[m.run])),
                                       styles[m.run].color)
                          for m in markers if m.run in series], near(series, _MARKER_SPAN))
        counts[key] = len(series)
        drawn.update(dict.fromkeys(series))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(key if key != TRAIN_METRIC else "loss (training)")
        ax.set_xlabel("step (each run's own)")
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
        if not counts[key]:
            ax.text(0.5, 0.5, f"no run logged {key}", transform=ax.transAxes, ha="center",
                    va="center", color="gray")

    legends = []
    if many:
        others = len(drawn) - len(set(coloured) & set(drawn))
        by = metric or TRAIN_METRIC
        legends.append(fig.legend(
            [Line2D([], [], linewidth=_LINE_WIDTH, color=styles[coloured[0]].color),
             Line2D([], [], linewidth=GREY_WIDTH, color=GREY)],
            [f"the best {len(coloured)} by {by}\n(labelled at their ends)",
             f"{others} other runs"], loc="outside right upper", title="runs",
            fontsize="small"))
    else:
        # One legend entry per run, whichever panels it has points in, naming only the knobs
        # that differ between the runs drawn. Its key is the run's style at the usual width
        # (a curve is drawn wider only where others lie on it).
        runs = [data.runs[n] for n in names if n in drawn]
        labels = run_labels(runs)
        handles = [Line2D([], [], linewidth=_LINE_WIDTH, markersize=5, markerfacecolor="none",
                          **styles[run.name].line()) for run in runs]
        texts = [labels[run.name] for run in runs]
        if handles:
            legends.append(fig.legend(handles, texts, loc="outside right upper", title="runs",
                                      **legend_style(texts)))
    keys, texts = legend_entries(markers)
    if keys:
        legends.append(fig.legend(keys, texts, loc="outside right lower", fontsize="small",
                                  title="ops" if not many else "ops (of the coloured runs)"))
    title = fig.suptitle(f"{data.name}: learning curves (metrics from {data.source})")
    fit_legends(fig, legends, axes_width, min_height=4.6, title=title)
    place_end_labels(fig, end_labels)
    return fig, counts


def plot_learning_curves(
    data: ExperimentData, path: str | os.PathLike, metric: str | None,
    markers: Sequence[Marker] | None = None, *, ranking: Sequence[str] | None = None,
    label_knobs: Sequence[str] = (),
) -> dict[str, int]:
    """Draw ``learning_curves.png``: one panel for the training ``loss`` and one for
    ``metric`` (a logged key, e.g. ``eval_loss``; none when ``None`` or ``loss``), one curve
    per run at its own global step (colour, line style and marker by run index; see
    :mod:`.plot_style`), the ``markers`` (default: :func:`op_markers` with the rejected
    ops) on the curves of their runs, and beside the axes a legend naming each run with the
    knobs that tell it apart and one of the ops' markers.

    Returns:
        panel (metric key) -> number of run curves drawn in it.
    """
    fig, counts = learning_curves_figure(data, metric, markers, ranking=ranking,
                                         label_knobs=label_knobs)
    # "tight" keeps anything that still reaches past the figure's edge in the image.
    fig.savefig(path, bbox_inches="tight", pad_inches=0.1)
    return counts


def schedule_figure(data: ExperimentData, *, ranking: Sequence[str] | None = None,
                    top: int = TOP_K) -> tuple[Figure, int]:
    """The figure of ``schedule.png`` (see :func:`plot_schedule`), not saved, and the number
    of bars. Past :data:`~.top_runs.MANY_RUNS` runs, the bars of the ``top`` best of
    ``ranking`` are in their colours of the learning curves, the others grey."""
    chunks = data.schedule
    workers = sorted({c.worker for c in chunks})
    height = max(3.4, 1.6 + 0.55 * len(workers))
    fig = _new_figure(10.5, height)
    ax = fig.subplots()
    if not chunks:
        ax.text(0.5, 0.5, "no chunk trained yet (schedule.csv is empty)", ha="center",
                va="center", transform=ax.transAxes, color="gray")
        ax.set_axis_off()
        return fig, 0
    # The runs' looks as in the learning curves (by run index); a run the schedule names and
    # the state does not (deleted meanwhile) still gets its own.
    names = list(dict.fromkeys([*data.runs, *(c.run for c in chunks)]))
    if ranking is None:
        ranking = [r.name for r in rank_runs(data, TRAIN_METRIC)]
    styles, coloured = highlight(names, ranking, top)
    t0 = min(c.start_time for c in chunks)
    row = {w: i for i, w in enumerate(workers)}
    labels = []
    for c in chunks:
        style = styles[c.run]
        bar = ax.barh(row[c.worker], c.seconds, left=c.start_time - t0, height=0.7,
                      color=style.color, hatch=style.hatch or None, edgecolor="white",
                      linewidth=0.6, label=c.run, gid=f"chunk:{c.run}:{c.number}")[0]
        r, g, b = to_rgb(style.color)
        ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"
        text = ax.text(c.start_time - t0 + c.seconds / 2, row[c.worker], str(c.number),
                       ha="center", va="center", fontsize=7, color=ink, clip_on=True,
                       gid=f"chunk-label:{c.run}:{c.number}")
        # Out of the layout: which labels stay is decided from the axes' place, which must
        # not in turn depend on the labels (a wide one would shrink the axes).
        text.set_in_layout(False)
        labels.append((text, bar))
    ax.set_yticks(range(len(workers)), [f"worker {w}" for w in workers])
    ax.set_ylim(len(workers) - 0.5, -0.5)  # worker 0 on top
    ax.set_xlim(0, max(c.end_time for c in chunks) - t0)
    ax.set_xlabel("seconds since the first chunk started")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    seen = sorted(dict.fromkeys(c.run for c in chunks), key=run_order)
    if len(names) > MANY_RUNS:
        others = len(seen) - len(set(seen) & set(coloured))
        seen = [n for n in coloured if n in set(seen)]
    handles = [Patch(facecolor=styles[n].color, hatch=styles[n].hatch or None,
                     edgecolor="white") for n in seen]
    texts = list(seen)
    if len(names) > MANY_RUNS:
        texts = [f"#{coloured.index(n) + 1} {n}" for n in seen] + [f"{others} other runs"]
        handles.append(Patch(facecolor=GREY, edgecolor="white"))
    legend = fig.legend(handles, texts, loc="outside right upper", title="runs",
                        **legend_style(texts))
    span = max(c.end_time for c in chunks) - t0
    title = fig.suptitle(f"{data.name}: chunks by worker ({len(chunks)} chunks in {span:.1f} s; "
                         "numbers: the run's chunk)")
    fit_legends(fig, [legend], 9.0, min_height=height, title=title)
    _drop_labels_that_do_not_fit(fig, ax, labels)
    return fig, len(chunks)


def _drop_labels_that_do_not_fit(fig: Figure, ax: Any, labels: Sequence[Any]) -> None:
    # Whether a label fits is known only once the layout has placed the axes: its drawn
    # extent must lie inside its bar, _LABEL_PAD pixels clear of the bar's edges, and inside
    # the axes (a bar cut by the axes' edge shows only part of its width).
    fig.draw_without_rendering()
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)  # _new_figure gave the figure an Agg canvas
    renderer = canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    for text, bar in labels:
        box = text.get_window_extent(renderer)
        room = bar.get_window_extent(renderer)
        left, right = max(room.x0, frame.x0), min(room.x1, frame.x1)
        if (box.x0 < left + _LABEL_PAD or box.x1 > right - _LABEL_PAD
                or box.y0 < room.y0 + _LABEL_PAD or box.y1 > room.y1 - _LABEL_PAD):
            text.remove()


def plot_schedule(data: ExperimentData, path: str | os.PathLike, *,
                  ranking: Sequence[str] | None = None) -> int:
    """Draw ``schedule.png``: one row per worker, one bar per trained chunk from its start to
    its end (seconds since the first chunk started), coloured by run and labelled with the
    run's chunk number where the label fits inside its bar. Returns the number of bars."""
    fig, bars = schedule_figure(data, ranking=ranking)
    fig.savefig(path, bbox_inches="tight", pad_inches=0.1)
    return bars


def write_report(
    output_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    metric: str | None = None,
    tracking_uri: str | None = None,
    experiment: str | None = None,
) -> ReportFiles:
    """Write ``learning_curves.png``, ``schedule.png``, ``why_wins.png`` (with two metrics,
    ``pareto.png`` too) and ``summary.md`` for the experiment in ``output_dir`` into
    ``out_dir`` (created if missing).

    Args:
        metric: the metric to plot beside the training loss and to rank the runs by
            (default: the experiment's ranking metric, :mod:`.ranking`, with its direction;
            ``eval_loss`` for an experiment that recorded none; a name without ``eval_``
            also finds ``eval_<name>``); lower is better for names ending in ``loss``, else
            higher. Two, separated by a comma
            (``eval_loss,accuracy``): the runs are ranked by the first, and the Pareto front
            of both is drawn.
        tracking_uri, experiment: the MLflow store and experiment name, defaulting as when
            the experiment was tracked (see :func:`load_experiment`).

    Returns:
        the files written, where the metrics came from, and what was drawn.

    Raises:
        LookupError: ``output_dir`` holds no trl-rapidfire experiment.
        ValueError: ``metric`` names no metric, or more than two.
    """
    recorded = read_ranking(output_dir) if metric is None else None
    metric = metric or (recorded.key if recorded else "eval_loss")
    first, *rest = split_metrics(metric)
    mode = recorded.mode if recorded else None
    data = load_experiment(output_dir, metric=metric, tracking_uri=tracking_uri,
                           experiment=experiment)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key = resolve_metric(data, first)
    second = resolve_metric(data, rest[0]) if rest else None
    markers = op_markers(data, rejected=True)
    ranking = [r.name for r in rank_runs(data, key or TRAIN_METRIC, mode if key else None)]
    why = why_wins(data, key, second, mode) if key else None
    important = [k for k, _ in why.importance] if why else []
    curves = plot_learning_curves(data, out / LEARNING_CURVES, key, markers, ranking=ranking,
                                  label_knobs=important)
    plot_schedule(data, out / SCHEDULE, ranking=ranking)
    images = [LEARNING_CURVES, SCHEDULE]
    if why is not None:
        why_wins_figure(data, why).savefig(out / WHY_WINS, bbox_inches="tight", pad_inches=0.1)
        images.append(WHY_WINS)
        if second:
            pareto_figure(data, why).savefig(out / PARETO, bbox_inches="tight",
                                             pad_inches=0.1)
            images.append(PARETO)
    (out / SUMMARY).write_text(summary_markdown(data, key, first, images, why, mode),
                               encoding="utf-8")
    return ReportFiles(out / LEARNING_CURVES, out / SCHEDULE, out / SUMMARY, data.source,
                       data.source_detail, key, curves, tuple(markers),
                       tuple(r.name for r in rank_runs(data, key, mode)),
                       out / WHY_WINS if WHY_WINS in images else None,
                       out / PARETO if PARETO in images else None, why)
