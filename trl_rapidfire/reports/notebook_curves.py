"""The notebook panel's training-loss plot, by the browser panel's curve rules
(``client/panel_static/panel_curves.js``): with tens or hundreds of runs a colour per run
cannot be told apart, so the top k runs by the objective (their latest training loss, lower
is better) are drawn in their colours and line styles (:mod:`.plot_style`, as the report's
figures), each named at its line's end, and the others thin and grey beneath them; no legend.
The k, the grey and the spreading of the names are the report's (:mod:`.top_runs`).

A bare ``Figure`` (no pyplot): nothing global, so it is safe from the panel's polling thread
and opens no window.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .plot_style import run_styles
from .top_runs import GREY, TOP_K, spread

__all__ = ["GREY", "TOP_K", "loss_figure", "loss_png", "top_runs"]

_LABEL_GAP = 0.05  # of the axes' height: end labels this far apart never overlap (9 pt text)


def top_runs(latest: Mapping[str, float | None], k: int = TOP_K) -> list[str]:
    """The ``k`` runs of lowest latest loss (``latest``: run -> its latest loss, ``None`` or
    not finite when it has none), best first; ties by name."""
    scored = [(value, name) for name, value in latest.items()
              if value is not None and math.isfinite(value)]
    return [name for _, name in sorted(scored)[:max(k, 0)]]


def loss_png(curves: Mapping[str, Sequence[tuple[int, float]]], k: int = TOP_K,
             top: Sequence[str] | None = None) -> bytes:
    """:func:`loss_figure` as PNG bytes."""
    out = io.BytesIO()
    loss_figure(curves, k, top).savefig(out, format="png")
    return out.getvalue()


def loss_figure(curves: Mapping[str, Sequence[tuple[int, float]]], k: int = TOP_K,
                top: Sequence[str] | None = None) -> Any:
    """The training loss of each run against its steps (a matplotlib ``Figure``): the best
    ``k`` runs in colour with their names at their lines' ends, the rest thin and grey. The
    best are ``top`` (best first, e.g. by the experiment's ranking metric) where given, else
    the :func:`top_runs` by their latest loss."""
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    drawn = {name: [(s, v) for s, v in points if v is not None and math.isfinite(v)]
             for name, points in curves.items()}
    drawn = {name: points for name, points in drawn.items() if points}
    if top is None:
        top = top_runs({name: points[-1][1] for name, points in drawn.items()}, k)
    else:  # the ranking's best that have a curve to colour
        top = [name for name in top if name in drawn][:max(k, 0)]
    styles = run_styles(list(curves))
    figure = Figure(figsize=(7, 3), dpi=100)
    axes = figure.add_subplot()
    for name, points in drawn.items():  # the grey ones first: the coloured ones lie on top
        if name not in top:
            steps, losses = zip(*points)
            axes.plot(steps, losses, color=GREY, linewidth=0.8, zorder=1)
    for name in top:
        steps, losses = zip(*drawn[name])
        style = styles[name]
        axes.plot(steps, losses, color=style.color, linestyle=style.linestyle, linewidth=1.6,
                  zorder=2)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.grid(alpha=0.3)
    if top:
        low, high = axes.get_ylim()
        span = (high - low) or 1.0
        ends = sorted(((drawn[n][-1][1] - low) / span, drawn[n][-1][0], n) for n in top)
        heights = spread([h for h, _, _ in ends], _LABEL_GAP, 0.0, 1.0)
        # x in steps (the line's end), y in the axes' height (pushed apart).
        where = blended_transform_factory(axes.transData, axes.transAxes)
        for (_, step, name), height in zip(ends, heights):
            axes.text(step, height, f" {name}", transform=where, color=styles[name].color,
                      fontsize=8, va="center", ha="left", clip_on=False)
        right = max(points[-1][0] for points in drawn.values())
        axes.set_xlim(right=right + max(right * 0.12, 1))  # room for the names
    figure.tight_layout()
    return figure
