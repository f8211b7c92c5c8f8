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
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from ..storage.schedule import ChunkRecord
from .experiment_data import (
    TRAIN_METRIC,
    ExperimentData,
    OpEvent,
    RunData,
    load_experiment,
    run_order,
)
from .plot_legend import fit_legends, legend_style, run_labels
from .report import format_value, pareto_front, search_rows

# ExperimentData, OpEvent, RunData and load_experiment live in experiment_data.py; they are
# still imported from here, where the report's public API has always been.
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

LEARNING_CURVES = "learning_curves.png"
SCHEDULE = "schedule.png"
SUMMARY = "summary.md"

# Marker shape per op verb; who issued the op is shown by the fill (see _draw_marker).
_MARKER_SHAPES = {"stop": "X", "resume": ">", "delete": "s", "fail": "v", "clone": "D",
                  "clone-warm": "*"}
_MARKER_LABELS = {"stop": "stop", "resume": "resume", "delete": "delete", "fail": "failed",
                  "clone": "clone (on the parent)", "clone-warm": "clone-warm (on the parent)"}
_DPI = 110
# Curves are told apart by line style and point marker as well as colour, so runs with the
# same curve (clones, runs that differ only in a knob that changed nothing yet) all show.
# 4 styles and 5 markers: no two of the first 20 runs share both, nor does any marker
# repeat an op's shape (the ops are drawn larger, on top). The tab20 colours cover 20 too.
# The markers are hollow, so that one drawn over another of the same point leaves it seen.
_LINE_STYLES = ("-", "--", "-.", ":")
_CURVE_MARKERS = ("o", "^", "P", "d", "p")
# Pixels a chunk's label keeps clear of its bar's sides (and top and bottom), so that labels
# of neighbouring bars never run into each other.
_LABEL_PAD = 4.0


@dataclass(frozen=True)
class Marker:
    """An applied op drawn on a run's curves.

    Attributes:
        run: the run whose curves carry it (a clone's parent for clones).
        kind: the op's verb: ``stop``, ``resume``, ``delete``, ``fail``, ``clone``,
            ``clone-warm``.
        step: the run's own global step where it happened.
        by_policy: issued by a policy rather than a person.
        result: the op's result text.
    """

    run: str
    kind: str
    step: int
    by_policy: bool
    result: str


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote, and what it drew (for checks).

    Attributes:
        learning_curves, schedule, summary: the files written.
        source, source_detail: where the metrics came from (see :class:`ExperimentData`).
        metric: the metric key the runs were ranked by (``None`` if no run logged it).
        curves: panel (metric key) -> number of run curves drawn in it.
        markers: the op markers drawn.
        ranking: run names, best first, as in the summary table.
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

    @property
    def paths(self) -> tuple[Path, Path, Path]:
        return (self.learning_curves, self.schedule, self.summary)


# ----------------------------------------------------------------------------- analysis


def resolve_metric(data: ExperimentData, metric: str) -> str | None:
    """The logged key for ``metric``: itself, else ``eval_<metric>`` (``accuracy`` names
    ``eval_accuracy``, as ``metric_for_best_model`` does); ``None`` if no run logged either."""
    for key in (metric, f"eval_{metric}"):
        if any(run.history.get(key) for run in data.runs.values()):
            return key
    return None


def rank_runs(data: ExperimentData, key: str | None, mode: str | None = None) -> list[RunData]:
    """The runs best first by their latest ``key``; runs without it last, in run order.

    ``mode``: ``min`` or ``max``; default ``min`` for names ending in ``loss``, else ``max``.
    """
    runs = list(data.runs.values())
    if key is None:
        return runs
    mode = mode or ("min" if key.endswith("loss") else "max")
    sign = 1.0 if mode == "min" else -1.0
    scored = [r for r in runs if r.latest(key) is not None]
    unscored = [r for r in runs if r.latest(key) is None]

    def score(run: RunData) -> float:
        value = run.latest(key)
        assert value is not None  # only the scored runs are sorted
        return sign * value

    # sorted() is stable: ties keep run order.
    return sorted(scored, key=score) + unscored


def _step_at(schedule: Sequence[ChunkRecord], run: str, when: float) -> int:
    """The run's step at wall-clock time ``when``: the end of its last chunk finished by then."""
    return max((c.end_step for c in schedule if c.run == run and c.end_time <= when), default=0)


def op_markers(data: ExperimentData) -> list[Marker]:
    """One marker per applied op (rejected and skipped ops changed nothing, so they are not
    drawn), at the step its result states, else at the run's step when it was applied."""
    out = []
    for op in data.ops:
        if not op.applied or op.verb not in _MARKER_SHAPES or op.run not in data.runs:
            continue
        step = op.step if op.step is not None else _step_at(data.schedule, op.run, op.time)
        out.append(Marker(op.run, op.verb, step, op.by_policy, op.result))
    return out


# ----------------------------------------------------------------------------- drawing


def _run_colors(names: Sequence[str]) -> dict[str, Any]:
    import matplotlib

    if len(names) <= 10:
        cmap = matplotlib.colormaps["tab10"]
        return {n: cmap(i) for i, n in enumerate(names)}
    if len(names) <= 20:
        cmap = matplotlib.colormaps["tab20"]
        return {n: cmap(i) for i, n in enumerate(names)}
    cmap = matplotlib.colormaps["turbo"]
    return {n: cmap(0.05 + 0.9 * i / (len(names) - 1)) for i, n in enumerate(names)}


def _run_styles(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    colors = _run_colors(names)
    return {n: {"color": colors[n], "linestyle": _LINE_STYLES[i % len(_LINE_STYLES)],
                "marker": _CURVE_MARKERS[i % len(_CURVE_MARKERS)]}
            for i, n in enumerate(names)}


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _draw_marker(ax: Any, marker: Marker, x: float, y: float, color: Any) -> None:
    # Filled in the run's colour: a person's op; hollow: a policy's decision.
    ax.plot([x], [y], linestyle="none", marker=_MARKER_SHAPES[marker.kind],
            markersize=11 if marker.kind == "clone-warm" else 8,
            markerfacecolor="white" if marker.by_policy else color,
            markeredgecolor=color if marker.by_policy else "black", markeredgewidth=1.3,
            zorder=5, gid=f"op:{marker.run}:{marker.kind}")


def learning_curves_figure(
    data: ExperimentData, metric: str | None, markers: Sequence[Marker] | None = None,
) -> tuple[Figure, dict[str, int]]:
    """The figure of ``learning_curves.png`` (see :func:`plot_learning_curves`), not saved,
    and panel (metric key) -> number of run curves drawn in it."""
    markers = op_markers(data) if markers is None else markers
    panels = [TRAIN_METRIC] + ([metric] if metric and metric != TRAIN_METRIC else [])
    names = list(data.runs)
    styles = _run_styles(names)
    axes_width = 5.2 * len(panels)
    fig = _new_figure(axes_width + 3.0, 4.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    counts: dict[str, int] = {}
    for ax, key in zip(axes, panels):
        for run in data.runs.values():
            series = [(s, v) for s, v in run.history.get(key, []) if math.isfinite(v)]
            if not series:
                continue
            xs = np.array([s for s, _ in series], dtype=float)
            ys = np.array([v for _, v in series], dtype=float)
            # Evaluations are a few points per run: a marker shows where each one was taken.
            # A dense curve gets about 10 markers spaced along it, started at a different
            # place run by run, so that the markers of equal curves fall apart.
            dense = len(series) > 15
            start = (names.index(run.name) * 0.618) % 1.0 * 0.1
            style = styles[run.name]
            ax.plot(xs, ys, linewidth=1.4, markersize=5, markerfacecolor="none",
                    markevery=(start, 0.1) if dense else None, gid=f"curve:{run.name}",
                    **style)
            for m in markers:
                if m.run == run.name:
                    _draw_marker(ax, m, m.step, float(np.interp(m.step, xs, ys)),
                                 style["color"])
        counts[key] = sum(1 for line in ax.get_lines()
                          if str(line.get_gid() or "").startswith("curve:"))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(key if key != TRAIN_METRIC else "loss (training)")
        ax.set_xlabel("step (each run's own)")
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
        if not counts[key]:
            ax.text(0.5, 0.5, f"no run logged {key}", transform=ax.transAxes, ha="center",
                    va="center", color="gray")

    # One legend entry per run, whichever panels it has points in, naming only the knobs
    # that differ between the runs drawn.
    by_run: dict[str, Line2D] = {}
    for ax in axes:
        for line in ax.get_lines():
            gid = str(line.get_gid() or "")
            if gid.startswith("curve:"):
                by_run.setdefault(gid[len("curve:"):], line)
    drawn = [data.runs[n] for n in names if n in by_run]
    labels = run_labels(drawn)
    handles = [by_run[run.name] for run in drawn]
    texts = [labels[run.name] for run in drawn]
    legends = []
    if handles:
        legends.append(fig.legend(handles, texts, loc="outside right upper", title="runs",
                                  **legend_style(texts)))
    kinds = [k for k in _MARKER_SHAPES if any(m.kind == k for m in markers)]
    if kinds:
        keys = [Line2D([], [], linestyle="none", marker=_MARKER_SHAPES[k], color="dimgray",
                       markeredgecolor="black", markersize=8) for k in kinds]
        texts = [_MARKER_LABELS[k] for k in kinds]
        if any(m.by_policy for m in markers):
            # An op's shape, not a circle: the curves' own hollow markers include circles.
            keys.append(Line2D([], [], linestyle="none", marker=_MARKER_SHAPES["stop"],
                               markerfacecolor="white", markeredgecolor="dimgray",
                               markersize=8))
            texts.append("hollow: by a policy")
        legends.append(fig.legend(keys, texts, loc="outside right lower", fontsize="small",
                                  title="ops"))
    title = fig.suptitle(f"{data.name}: learning curves (metrics from {data.source})")
    fit_legends(fig, legends, axes_width, min_height=4.6, title=title)
    return fig, counts


def plot_learning_curves(
    data: ExperimentData, path: str | os.PathLike, metric: str | None,
    markers: Sequence[Marker] | None = None,
) -> dict[str, int]:
    """Draw ``learning_curves.png``: one panel for the training ``loss`` and one for
    ``metric`` (a logged key, e.g. ``eval_loss``; none when ``None`` or ``loss``), one curve
    per run at its own global step (colour, line style and marker vary by run), the
    ``markers`` (default :func:`op_markers`) on the curves of their runs, and beside the
    axes a legend naming each run with the knobs that tell it apart.

    Returns:
        panel (metric key) -> number of run curves drawn in it.
    """
    fig, counts = learning_curves_figure(data, metric, markers)
    # "tight" keeps anything that still reaches past the figure's edge in the image.
    fig.savefig(path, bbox_inches="tight", pad_inches=0.1)
    return counts


def schedule_figure(data: ExperimentData) -> tuple[Figure, int]:
    """The figure of ``schedule.png`` (see :func:`plot_schedule`), not saved, and the number
    of bars."""
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
    colors = _run_colors(list(data.runs))
    t0 = min(c.start_time for c in chunks)
    row = {w: i for i, w in enumerate(workers)}
    labels = []
    for c in chunks:
        color = colors.get(c.run, "gray")
        bar = ax.barh(row[c.worker], c.seconds, left=c.start_time - t0, height=0.7,
                      color=color, edgecolor="white", linewidth=0.6, label=c.run,
                      gid=f"chunk:{c.run}:{c.number}")[0]
        r, g, b = color[:3] if not isinstance(color, str) else (0.5, 0.5, 0.5)
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
    handles = [Line2D([], [], linestyle="none", marker="s", markersize=9,
                      color=colors.get(n, "gray")) for n in seen]
    legend = fig.legend(handles, seen, loc="outside right upper", title="runs",
                        **legend_style(seen))
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


def plot_schedule(data: ExperimentData, path: str | os.PathLike) -> int:
    """Draw ``schedule.png``: one row per worker, one bar per trained chunk from its start to
    its end (seconds since the first chunk started), coloured by run and labelled with the
    run's chunk number where the label fits inside its bar. Returns the number of bars."""
    fig, bars = schedule_figure(data)
    fig.savefig(path, bbox_inches="tight", pad_inches=0.1)
    return bars


# ----------------------------------------------------------------------------- summary


def _cell(text: Any) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def summary_markdown(
    data: ExperimentData, metric: str | None, requested: str = "eval_loss",
    images: Sequence[str] = (LEARNING_CURVES, SCHEDULE),
) -> str:
    """The markdown summary: where the metrics came from, a table of the runs ranked by
    ``metric`` (a logged key; ``requested`` is what was asked for, named when no run logged
    it) with status, steps, the metric, the number of ops on each run and the last op's result,
    then the ``images`` linked."""
    ranked = rank_runs(data, metric)
    mode = ("min" if metric.endswith("loss") else "max") if metric else None
    ops_of: dict[str, list[OpEvent]] = {}
    for op in data.ops:
        ops_of.setdefault(op.run, []).append(op)
    lines = [f"# Experiment report: {_cell(data.name)}", "",
             f"- output_dir: `{data.output_dir}`",
             f"- metrics from: {_cell(data.source_detail)}"]
    if metric:
        lines.append(f"- ranked by: `{metric}` (latest value, {mode} is best)")
    else:
        lines.append(f"- ranked by: no run logged `{requested}`; runs in run order")
    if data.schedule:
        span = max(c.end_time for c in data.schedule) - min(c.start_time for c in data.schedule)
        workers = len({c.worker for c in data.schedule})
        lines.append(f"- {len(data.runs)} runs, {len(data.schedule)} chunks on {workers} "
                     f"worker(s) in {span:.1f} s, {len(data.ops)} op(s)")
    lines += ["", f"| rank | run | status | steps | {metric or requested} | ops | last op | "
              "knobs |", "| ---: | --- | --- | ---: | ---: | ---: | --- | --- |"]
    rank = 0
    for run in ranked:
        value = run.latest(metric) if metric else None
        if value is not None:
            rank += 1
        mine = ops_of.get(run.name, [])
        knobs = ", ".join(f"{k}={format_value(v)}" for k, v in run.knobs.items())
        lines.append("| " + " | ".join(_cell(x) for x in (
            rank if value is not None else "-", run.name, run.status or "-",
            "-" if run.steps is None else run.steps, format_value(value), len(mine),
            mine[-1].result if mine else "", knobs)) + " |")
    rows = search_rows(data.search)
    if rows:
        lines += ["", "## Search", "", "What the sampler proposed, when (after its first "
                  "proposal), and what it was told (`search.csv`).", "",
                  "| trial | run | proposed | params | told |", "| ---: | --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
        front = pareto_front(data.search)
        if front is not None:
            lines += ["", f"Pareto front (no run better in every objective): "
                      f"{', '.join(front) or '-'}"]
    for image in images:
        title = Path(image).stem.replace("_", " ").capitalize()
        lines += ["", f"## {title}", "", f"![{title}]({image})"]
    return "\n".join(lines) + "\n"


def write_report(
    output_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    metric: str = "eval_loss",
    tracking_uri: str | None = None,
    experiment: str | None = None,
) -> ReportFiles:
    """Write ``learning_curves.png``, ``schedule.png`` and ``summary.md`` for the experiment
    in ``output_dir`` into ``out_dir`` (created if missing).

    Args:
        metric: the metric to plot beside the training loss and to rank the runs by
            (``eval_loss``; a name without ``eval_`` also finds ``eval_<name>``); lower is
            better for names ending in ``loss``, else higher.
        tracking_uri, experiment: the MLflow store and experiment name, defaulting as when
            the experiment was tracked (see :func:`load_experiment`).

    Returns:
        the files written, where the metrics came from, and what was drawn.

    Raises:
        LookupError: ``output_dir`` holds no trl-rapidfire experiment.
    """
    data = load_experiment(output_dir, metric=metric, tracking_uri=tracking_uri,
                           experiment=experiment)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key = resolve_metric(data, metric)
    markers = op_markers(data)
    curves = plot_learning_curves(data, out / LEARNING_CURVES, key, markers)
    plot_schedule(data, out / SCHEDULE)
    (out / SUMMARY).write_text(summary_markdown(data, key, metric), encoding="utf-8")
    return ReportFiles(out / LEARNING_CURVES, out / SCHEDULE, out / SUMMARY, data.source,
                       data.source_detail, key, curves, tuple(markers),
                       tuple(r.name for r in rank_runs(data, key)))
