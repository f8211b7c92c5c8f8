"""Runs whose curves coincide, found so that the report can still show each of them.

Equal curves are common in a hyperparallel experiment: a clone of a run with a knob that
changes nothing yet, runs of a list that differ only in a knob that acts later (a warmup, a
schedule's tail), a run resumed from the same state. Drawn one over another, the last one
drawn hides the others. Colour, line style and hollow point markers (see :mod:`.plot_style`)
let the lower ones show through the gaps of the upper ones; two things are added where, and
only where, a curve lies on another:

- casing: a run drawn under later runs that lie on it (over a good part of it) is drawn
  wider, by one step per such run, so it shows as a border on both sides of them (as a map
  draws a road over a wider one of another colour). Runs that coincide with no other keep
  the usual width, so width does not otherwise mean anything;
- end labels: where a curve ends on another curve, its end is labelled with its name (one
  label naming all the runs that end at that point), since there the colour of the line
  seen is another run's.

"Coincide" is within a fraction of the panel's span of values: what a person cannot tell
apart at the figure's size, not only exact equality.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["CASING_STEP", "EndLabel", "casing", "ends_on_others", "near"]

# Extra line width (points) per later run lying on a curve, and the most steps added: past
# 3 the border would be wider than the curves' markers, and the labels name the rest.
CASING_STEP = 1.3
_MAX_CASING = 3
# Fraction of a panel's span of values within which two points look like one: about the
# width of a line on the panel's axes (some 250 points high at the report's size).
_SAME_POINT = 0.006
# Share of the lines between common steps two curves must have in common for one to hide
# the other: a third is more than the first steps where runs start together and fan out.
_COVERED = 1 / 3

Series = Mapping[str, tuple[np.ndarray, np.ndarray]]


def near(series: Series, fraction: float = _SAME_POINT) -> float:
    """The distance in y under which two points of the panel drawn from ``series`` (run ->
    ``(xs, ys)``) look like one: ``fraction`` of the span of all their values (0 if every
    value is the same: only equal points coincide then)."""
    values = [ys for _, ys in series.values() if len(ys)]
    if not values:
        return 0.0
    every = np.concatenate(values)
    return float(fraction * (every.max() - every.min()))


def _covers(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
            tol: float) -> bool:
    """Whether curves ``a`` and ``b`` lie on each other over a good part of one of them: at
    least :data:`_COVERED` of the lines between the steps both logged (a line whose two ends
    coincide coincides too), or the one point of a curve that has only one.

    Not merely somewhere: runs start from the same model, so most curves start at one point
    and fan out, and a few coinciding first steps hide no run."""
    common, ia, ib = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
    if not len(common):
        return False
    same = np.abs(a[1][ia] - b[1][ib]) <= tol
    if min(len(a[0]), len(b[0])) == 1:
        return bool(same.any())
    lines = same[1:] & same[:-1]
    return len(lines) > 0 and float(lines.mean()) >= _COVERED


def casing(series: Series, tol: float) -> dict[str, int]:
    """Run -> how many runs drawn after it (``series`` is in drawing order) lie on its curve
    over a good part of it (see :func:`_covers`), at most 3: its line is drawn that many
    :data:`CASING_STEP` wider."""
    names = list(series)
    out = {}
    for i, name in enumerate(names):
        above = sum(1 for later in names[i + 1:]
                    if _covers(series[name], series[later], tol))
        out[name] = min(above, _MAX_CASING)
    return out


@dataclass(frozen=True)
class EndLabel:
    """A label at ``(x, y)``, the last point of the curves of ``runs``, which lies on another
    run's curve."""

    x: float
    y: float
    runs: tuple[str, ...]


def ends_on_others(series: Series, tol: float) -> list[EndLabel]:
    """The ends of curves that lie on another run's curve (within ``tol`` of it, inside its
    span of steps), runs ending at the same point under one label, in drawing order."""
    labels: list[EndLabel] = []
    for name, (xs, ys) in series.items():
        if not len(xs):
            continue
        x, y = float(xs[-1]), float(ys[-1])
        covered = any(
            other != name and len(oxs) and oxs[0] <= x <= oxs[-1]
            and abs(float(np.interp(x, oxs, oys)) - y) <= tol
            for other, (oxs, oys) in series.items())
        if not covered:
            continue
        at = next((i for i, lb in enumerate(labels) if lb.x == x and abs(lb.y - y) <= tol),
                  None)
        if at is None:
            labels.append(EndLabel(x, y, (name,)))
        else:
            labels[at] = EndLabel(labels[at].x, labels[at].y, (*labels[at].runs, name))
    return labels
