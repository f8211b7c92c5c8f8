"""The report's figures for many runs: the best few by the objective in colour, labelled at
their curves' ends, and all the others thin and grey.

Up to :data:`MANY_RUNS` runs each has a colour of its own and a line in the legend (see
:mod:`.plot_style` and :mod:`.plot_legend`). Past that, a legend of every run would take more
room than the axes and the colours would repeat, so the :data:`TOP_K` best runs (ranked as the
summary ranks them) get the first colours of the palette, one each, and a label at the right of
the axes with a leader line to their curve's end; the others are drawn thin and grey under
them, where they still show the spread of the experiment. The labels are spread apart in
height so that no two overlap, as close to their curves' ends as that allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..storage.csv_logs import printable
from .experiment_data import RunData
from .plot_legend import short_values
from .plot_style import PALETTE, RunStyle, run_styles
from .report import short_name

__all__ = ["GREY", "MANY_RUNS", "TOP_K", "EndLabel", "end_label_texts", "highlight",
           "place_end_labels", "spread"]

MANY_RUNS = 20
"""Runs beyond which the figures colour only the best :data:`TOP_K` (the palette's size: up to
it, no two runs share a colour)."""
TOP_K = 10
"""Runs drawn in colour in a figure of many runs."""
GREY = "#b3b3b3"
"""The colour of the runs not among the best: light enough to stay under the coloured ones."""
GREY_WIDTH = 0.6
# Space between a label's line and the next, as a multiple of the font size: matplotlib's
# line height is 1.2 font sizes, so labels this far apart never touch.
_LINE_SPACING = 1.25
# The labels' distance from the axes' right edge, as a fraction of the axes' width.
_LABEL_X = 1.03
_LABEL_CHARS = 44
# Knobs named in an end label at most: the label stays one short line.
_LABEL_KNOBS = 2


@dataclass(frozen=True)
class EndLabel:
    """A label of a coloured run's curve: the run, where the curve ends (data coordinates),
    and the annotation drawn."""

    run: str
    x: float
    y: float
    artist: Any


def highlight(names: Sequence[str], ranking: Sequence[str], top: int = TOP_K
              ) -> tuple[dict[str, RunStyle], list[str]]:
    """The runs' looks for a figure of ``names``, and the runs drawn in colour, best first.

    Up to :data:`MANY_RUNS` runs: every run in its own style (:func:`~.plot_style.run_styles`)
    and all in colour. More: the first ``top`` of ``ranking`` (run names, best first; runs not
    in it come last) in the palette's colours by rank, solid; the rest :data:`GREY`."""
    if len(names) <= MANY_RUNS:
        return run_styles(names), list(names)
    order = [n for n in ranking if n in set(names)]
    order += [n for n in names if n not in set(order)]
    coloured = order[:max(0, min(top, len(PALETTE)))]
    styles = {name: RunStyle(GREY, "-", "", "") for name in names}
    for rank, name in enumerate(coloured):
        styles[name] = RunStyle(PALETTE[rank], "-", "", "")
    return styles, coloured


def end_label_texts(runs: Sequence[RunData], knobs: bool = True,
                    order: Sequence[str] | None = None, most: int = _LABEL_KNOBS
                    ) -> dict[str, str]:
    """Run name -> its end label: its rank among ``runs`` (best first), its name and, with
    ``knobs``, up to ``most`` knobs that differ between ``runs`` by their short names
    (``#1 run-12  lr=3e-04 sched=cosine``): the first of ``order`` (the knobs by importance)
    that do, else the first that do. Cut at 44 characters."""
    columns: dict[str, list[str]] = {}
    if knobs and len(runs) > 1:
        keys = list(dict.fromkeys([*(order or ()), *(k for run in runs for k in run.knobs)]))
        for key in keys:
            texts, self_named = short_values([run.knobs.get(key, "-") for run in runs])
            if len(set(texts)) > 1:
                columns[key] = texts if self_named else [f"{short_name(key)}={t}" for t in texts]
            if len(columns) == most:
                break
    out = {}
    for i, run in enumerate(runs):
        text = "  ".join([f"#{i + 1} {run.name}", " ".join(c[i] for c in columns.values())])
        text = text.rstrip()
        text = text if len(text) <= _LABEL_CHARS else \
            text[:_LABEL_CHARS - 1] + "\N{HORIZONTAL ELLIPSIS}"
        # Literal: control characters escaped, "$" not matplotlib's math mode.
        out[run.name] = printable(text).replace("$", r"\$")
    return out


def draw_end_labels(ax: Any, ends: Mapping[str, tuple[float, float]],
                    texts: Mapping[str, str], styles: Mapping[str, RunStyle]
                    ) -> list[EndLabel]:
    """A label per run of ``ends`` (run -> its curve's last point) right of ``ax``, joined to
    that point by a thin line of the run's colour; at the point's height until
    :func:`place_end_labels` spreads them."""
    labels = []
    for run, (x, y) in ends.items():
        color = styles[run].color
        artist = ax.annotate(
            texts[run], (x, y), xycoords="data", xytext=(_LABEL_X, 0.5),
            textcoords="axes fraction", ha="left", va="center", fontsize="small",
            color=color, annotation_clip=False, gid=f"top-label:{run}",
            arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.6, "alpha": 0.8,
                        "shrinkA": 0, "shrinkB": 1})
        labels.append(EndLabel(run, x, y, artist))
    return labels


def spread(targets: Sequence[float], gap: float, low: float, high: float) -> list[float]:
    """Heights for labels wanted at ``targets``, each at least ``gap`` from the next, within
    ``[low, high]`` where they fit there (else from ``low`` up), moved as little as that
    allows: the labels keep the order of their targets.

    Placed bottom up, each no lower than the one below it plus ``gap``; what then sticks out
    at the top is pushed down, the ones below it with it."""
    order = sorted(range(len(targets)), key=lambda i: targets[i])
    placed = [0.0] * len(targets)
    floor = low
    for i in order:
        placed[i] = max(min(max(targets[i], low), high), floor)
        floor = placed[i] + gap
    ceiling = high
    for i in reversed(order):
        if placed[i] <= ceiling:
            break
        placed[i] = ceiling
        ceiling -= gap
    # Pushed below ``low`` (more labels than fit): stack them from ``low`` up instead.
    if order and placed[order[0]] < low:
        for rank, i in enumerate(order):
            placed[i] = low + rank * gap
    return placed


def place_end_labels(fig: Any, labels: Sequence[EndLabel]) -> None:
    """Move each axes' end labels as close to their curves' ends as they can be without two
    overlapping. Call once the figure has its final size: the spacing is measured in
    display units after a layout pass (the labels take no part in the layout's height)."""
    if not labels:
        return
    fig.draw_without_rendering()
    by_axes: dict[Any, list[EndLabel]] = {}
    for label in labels:
        by_axes.setdefault(label.artist.axes, []).append(label)
    for ax, mine in by_axes.items():
        frame = ax.get_window_extent()
        size = mine[0].artist.get_fontsize() * fig.dpi / 72
        gap = size * _LINE_SPACING
        targets = [float(ax.transData.transform((lb.x, lb.y))[1]) for lb in mine]
        heights = spread(targets, gap, frame.y0 + gap / 2, frame.y1 - gap / 2)
        for label, height in zip(mine, heights):
            label.artist.xyann = (_LABEL_X, (height - frame.y0) / frame.height)
