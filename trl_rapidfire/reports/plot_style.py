"""How each run looks in the report's figures: its colour, line style and curve marker (and in
the schedule chart, the hatch of its bars), all taken from its run index.

From the index, not from the run's place among the runs drawn: ``run-4`` has the same colour
in the learning curves and the schedule, in a report drawn while the experiment trains and in
one drawn after a clone was added, and in every re-run of the same script.

The colours are 20 that stay apart from each other for a person: a run's colour is the one
thing the legend and the schedule chart name it by. Past 20 runs the colours repeat, and the
line style (the hatch, for bars) tells ``run-3`` from ``run-23``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..storage.layout import run_index

__all__ = [
    "CURVE_MARKERS",
    "HATCHES",
    "LINE_STYLES",
    "PALETTE",
    "RunStyle",
    "run_style",
    "run_styles",
]

# 20 colours, each the one farthest (CIEDE2000) from all chosen before it, among the sRGB
# colours of CIELAB lightness 30-75 and chroma 25-70: dark enough to see as a thin line on
# white, not so dark it reads as black, none grey (grey is a rejected op's marker, black the
# ops' edges). Farthest-first, so the first few runs (most experiments have few) are as far
# apart as can be: the least distance is about 26 (CIEDE2000) in the first 10 and about 19 in
# all 20, where matplotlib's tab10 has 16 and 17 (red and brown, purple and pink: runs 3 and 5,
# 4 and 6) and tab20 has 12 (its light and dark shades of a hue are meant to pair).
# It starts from matplotlib's default blue, so a single run looks as matplotlib would draw it.
PALETTE = (
    "#1f77b4", "#b4b41e", "#960000", "#ff78c3", "#005a1e",
    "#781e87", "#ff874b", "#00c3b4", "#785a00", "#a5b4ff",
    "#a56969", "#2da53c", "#00c3ff", "#007878", "#9669d2",
    "#c38700", "#a5004b", "#87875a", "#3c4b78", "#b45a1e",
)
# Line styles and hollow point markers vary within the first 20 runs too, so that curves that
# coincide (clones, runs that differ in a knob that changed nothing yet) show each other
# through their gaps: 4 styles and 5 markers, so no two of the first 20 share both. Neither
# marker repeats an op's shape (the ops are drawn larger, on top).
LINE_STYLES = ("-", "--", "-.", ":")
CURVE_MARKERS = ("o", "^", "P", "d", "p")
# The schedule's bars have no line style: each later round of 20 runs hatches its bars.
HATCHES = ("", "//", "..", "xx")


@dataclass(frozen=True)
class RunStyle:
    """A run's look: ``color`` (hex), ``linestyle`` and ``marker`` of its curves, ``hatch``
    of its schedule bars."""

    color: str
    linestyle: str
    marker: str
    hatch: str

    def line(self) -> dict[str, Any]:
        """``Axes.plot`` keywords of the run's curves."""
        return {"color": self.color, "linestyle": self.linestyle, "marker": self.marker}


def run_style(index: int) -> RunStyle:
    """The look of the run with run index ``index`` (``run-<index>``).

    The colour cycles every 20 runs; each round of 20 shifts the line style by one, so no two
    of the first 80 runs share both colour and line style (a run and the one 20 later share
    the colour, never the line style), and no two of the first 20 share line style and marker.
    """
    index = max(index, 0)
    rounds = index // len(PALETTE)
    return RunStyle(
        color=PALETTE[index % len(PALETTE)],
        linestyle=LINE_STYLES[(index + rounds) % len(LINE_STYLES)],
        marker=CURVE_MARKERS[index % len(CURVE_MARKERS)],
        hatch=HATCHES[rounds % len(HATCHES)],
    )


def run_styles(names: Sequence[str]) -> dict[str, RunStyle]:
    """Run name -> its :class:`RunStyle`, by run index; a name without one (not a
    ``run-<index>`` name; the report reads none) by its place in ``names``."""
    return {name: run_style(index if (index := run_index(name)) is not None else position)
            for position, name in enumerate(names)}
