"""The ops on the learning curves: one marker per op at the step where it happened on its run,
its shape saying what it did, its fill who decided it, and the ops that were rejected as a
grey cross, so that an op someone sent and that changed nothing is seen too.

Several ops often happen at one place: a stop and a resume at the same step, a policy's stop
of two runs whose curves coincide. Such markers are set side by side, left to right in the
order the ops were handled, centred on the point, rather than one on top of the other where
only the last would show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.lines import Line2D
from matplotlib.transforms import ScaledTranslation

from ..control.ops import OpOutcome
from ..storage.schedule import ChunkRecord
from .experiment_data import ExperimentData, OpEvent

__all__ = ["Marker", "PlacedMarker", "draw_markers", "legend_entries", "op_markers"]

# Marker shape per op verb; who issued the op is shown by the fill (see _draw).
SHAPES = {"stop": "X", "resume": ">", "delete": "s", "fail": "v", "clone": "D",
          "clone-warm": "*"}
LABELS = {"stop": "stop", "resume": "resume", "delete": "delete", "fail": "failed",
          "clone": "clone (on the parent)", "clone-warm": "clone-warm (on the parent)"}
# A thin cross in grey, whatever the verb: the palette has no grey (see plot_style), so it
# belongs to no run, and its thin strokes read as crossed out, unlike any filled shape of an
# applied op (a stop is a thick filled X).
REJECTED_SHAPE = "x"
REJECTED_COLOR = "0.45"
_REJECTED_SIZE = 10.0
_REJECTED_EDGE = 1.4
REJECTED_LABEL = "rejected (changed nothing)"
_SIZE = 8.0
_STAR_SIZE = 11.0  # a star fills less of its box than the other shapes
# Points between the centres of markers set side by side: the largest marker and its edge.
SPREAD = 12.5


@dataclass(frozen=True)
class Marker:
    """An op drawn on a run's curves.

    Attributes:
        run: the run whose curves carry it (a clone's parent for clones).
        kind: the op's verb: ``stop``, ``resume``, ``delete``, ``fail``, ``clone``,
            ``clone-warm`` (a rejected op's: whatever its text began with).
        step: the run's own global step where it happened.
        by_policy: issued by a policy rather than a person.
        result: the op's result text.
        rejected: the op was answered with an error and changed nothing.
    """

    run: str
    kind: str
    step: int
    by_policy: bool
    result: str
    rejected: bool = False

    @property
    def label(self) -> str:
        """What the ops legend calls it."""
        return REJECTED_LABEL if self.rejected else LABELS[self.kind]


@dataclass(frozen=True)
class PlacedMarker:
    """A marker at its point on a curve: ``x``, ``y`` in data, ``color`` the run's."""

    marker: Marker
    x: float
    y: float
    color: str


def _step_at(schedule: Sequence[ChunkRecord], run: str, when: float) -> int:
    """The run's step at wall-clock time ``when``: the end of its last chunk finished by then."""
    return max((c.end_step for c in schedule if c.run == run and c.end_time <= when), default=0)


def _is_rejected(op: OpEvent) -> bool:
    # The result is "<outcome>: <detail>" (control.ops.OpResult); "skipped" is not a
    # rejection: it is a policy's op that a person's op on the same run, drawn, overrode.
    return op.result.partition(":")[0].strip() == OpOutcome.ERROR.value


def op_markers(data: ExperimentData, *, rejected: bool = False) -> list[Marker]:
    """One marker per applied op, in the order handled, at the step its result states, else
    at the run's step when it was applied; with ``rejected``, the rejected ops too.

    Skipped ops (a policy's, when a person's op on the run came at the same boundary) are
    never drawn: the person's op is, at the same place. Neither are ops on runs the report
    does not know (a rejected op may name a run that never was).
    """
    out = []
    for op in data.ops:
        if op.run not in data.runs:
            continue
        refused = _is_rejected(op)
        if not (op.applied and op.verb in SHAPES) and not (rejected and refused):
            continue
        step = op.step if op.step is not None else _step_at(data.schedule, op.run, op.time)
        out.append(Marker(op.run, op.verb, step, op.by_policy, op.result, rejected=refused))
    return out


def _side_by_side(placed: Sequence[PlacedMarker], near: float) -> list[float]:
    """Each marker's offset in points: markers at the same step less than ``near`` apart in
    y (where one would cover the other) are spread left to right in their order in
    ``placed``, centred on their point; the others stay where they are."""
    offsets = [0.0] * len(placed)
    groups: list[list[int]] = []
    for i, p in enumerate(placed):
        group = next((g for g in groups if placed[g[0]].x == p.x
                      and abs(placed[g[0]].y - p.y) <= near), None)
        if group is None:
            groups.append([i])
        else:
            group.append(i)
    for group in groups:
        for j, i in enumerate(group):
            offsets[i] = (j - (len(group) - 1) / 2) * SPREAD
    return offsets


def draw_markers(ax: Any, placed: Sequence[PlacedMarker], near: float) -> None:
    """Draw ``placed`` (in the order the ops were handled) on ``ax``, side by side where
    they would cover each other (see :func:`_side_by_side`). Each artist is labelled with
    its legend text and has the gid ``op:<run>:<kind>`` (``op-rejected:`` when rejected)."""
    for p, dx in zip(placed, _side_by_side(placed, near)):
        # Offset in points, so the markers keep apart however the axes are scaled.
        shift = ScaledTranslation(dx / 72.0, 0.0, ax.figure.dpi_scale_trans)
        _draw(ax, p, ax.transData + shift)


def _draw(ax: Any, p: PlacedMarker, transform: Any) -> None:
    m = p.marker
    common = {"linestyle": "none", "transform": transform, "label": m.label,
              "scalex": False, "scaley": False}  # on a curve: its limits already hold it
    if m.rejected:
        ax.plot([p.x], [p.y], marker=REJECTED_SHAPE, markersize=_REJECTED_SIZE,
                markeredgewidth=_REJECTED_EDGE, color=REJECTED_COLOR, zorder=6,
                gid=f"op-rejected:{m.run}:{m.kind}", **common)
        return
    # Filled in the run's colour: a person's op; hollow: a policy's decision.
    ax.plot([p.x], [p.y], marker=SHAPES[m.kind],
            markersize=_STAR_SIZE if m.kind == "clone-warm" else _SIZE,
            markerfacecolor="white" if m.by_policy else p.color,
            markeredgecolor=p.color if m.by_policy else "black", markeredgewidth=1.3,
            zorder=5, gid=f"op:{m.run}:{m.kind}", **common)


def legend_entries(markers: Sequence[Marker]) -> tuple[list[Line2D], list[str]]:
    """The ops legend's keys and texts: each shape drawn, then what a hollow one and the
    grey cross mean where there are any."""
    applied = [m for m in markers if not m.rejected]
    kinds = [k for k in SHAPES if any(m.kind == k for m in applied)]
    keys = [Line2D([], [], linestyle="none", marker=SHAPES[k], color="dimgray",
                   markeredgecolor="black", markersize=_SIZE) for k in kinds]
    texts = [LABELS[k] for k in kinds]
    if any(m.by_policy for m in applied):
        # An op's shape, not a circle: the curves' own hollow markers include circles.
        keys.append(Line2D([], [], linestyle="none", marker=SHAPES["stop"],
                           markerfacecolor="white", markeredgecolor="dimgray",
                           markersize=_SIZE))
        texts.append("hollow: by a policy")
    if any(m.rejected for m in markers):
        keys.append(Line2D([], [], linestyle="none", marker=REJECTED_SHAPE,
                           color=REJECTED_COLOR, markeredgewidth=_REJECTED_EDGE,
                           markersize=_REJECTED_SIZE))
        texts.append(REJECTED_LABEL)
    return keys, texts
