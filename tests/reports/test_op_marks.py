"""The ops on the learning curves: ops at one place set side by side (a stop and a resume at
the same step both seen), and rejected ops drawn as a grey cross the legend names."""

from __future__ import annotations

import itertools
from pathlib import Path

from trl_rapidfire.control.ops import OpOutcome, OpRecord, OpResult, append_op_row
from trl_rapidfire.reports.experiment_data import read_ops
from trl_rapidfire.reports.op_marks import REJECTED_LABEL
from trl_rapidfire.reports.plots import (
    ExperimentData,
    OpEvent,
    RunData,
    learning_curves_figure,
    op_markers,
)

SAME = {"loss": [(s, 2.0 - s / 100) for s in range(1, 41)],
        "eval_loss": [(s, 2.2 - s / 100) for s in (10, 20, 30, 40)]}
OTHER = {"loss": [(s, 2.0 - s / 30) for s in range(1, 41)],
         "eval_loss": [(s, 2.2 - s / 30) for s in (10, 20, 30, 40)]}


def _data(ops, histories=None) -> ExperimentData:
    histories = histories or {"run-0": SAME, "run-1": SAME, "run-2": OTHER}
    runs = {n: RunData(n, "running", 40, {"learning_rate": 1e-3 * (i + 1)}, h, "disk")
            for i, (n, h) in enumerate(histories.items())}
    return ExperimentData(Path("exp"), "exp", runs, [], list(ops), "disk", "d")


def _op(time, run, op, outcome, detail, source="tag") -> OpEvent:
    # The result text as the engine writes it (control.ops.OpResult).
    return OpEvent(time, source, run, op, str(OpResult(outcome, detail)))


def _ops_drawn(ax) -> dict[str, list]:
    """gid -> the op markers with it, in the order drawn."""
    out: dict[str, list] = {}
    for line in ax.get_lines():
        gid = str(line.get_gid() or "")
        if gid.startswith(("op:", "op-rejected:")):
            out.setdefault(gid, []).append(line)
    return out


def _at(line):
    """Where a marker is on the canvas (pixels)."""
    return line.get_transform().transform(line.get_xydata())[0]


def _pixels(fig, points: float) -> float:
    return points * fig.dpi / 72


def test_a_stop_and_a_resume_at_one_step_are_drawn_side_by_side():
    ok = OpOutcome.OK
    data = _data([
        _op(1.0, "run-2", "stop", ok, "stopped at step 20"),
        _op(2.0, "run-2", "resume", ok, "resumed at step 20"),
        # A policy stops run-0 and a person run-1 at step 30, where their curves coincide.
        _op(3.0, "run-0", "stop", ok, "stopped at step 30 by SuccessiveHalving",
            source="policy:SuccessiveHalving"),
        _op(4.0, "run-1", "stop", ok, "stopped at step 30"),
        _op(5.0, "run-2", "stop", ok, "stopped at step 35"),  # alone: on its point
    ])
    fig, _ = learning_curves_figure(data, "eval_loss")
    fig.draw_without_rendering()
    for ax in fig.axes:
        drawn = _ops_drawn(ax)
        stop, resume = drawn["op:run-2:stop"][0], drawn["op:run-2:resume"][0]
        curve = next(line for line in ax.get_lines() if line.get_gid() == "curve:run-2")
        point = ax.transData.transform((20, float(dict(curve.get_xydata())[20])))
        a, b = _at(stop), _at(resume)
        # Apart by more than a marker (8 points), in the order handled (the stop left),
        # at the height of their point and centred on it.
        assert b[0] - a[0] >= _pixels(fig, 8)
        assert abs(a[1] - point[1]) < 0.5 and abs(b[1] - point[1]) < 0.5
        assert abs((a[0] + b[0]) / 2 - point[0]) < 0.5
        by_policy, by_person = drawn["op:run-0:stop"][0], drawn["op:run-1:stop"][0]
        assert _at(by_person)[0] - _at(by_policy)[0] >= _pixels(fig, 8)
        last = drawn["op:run-2:stop"][1]  # the stop at step 35, with no other op there
        assert abs(_at(last)[0] - ax.transData.transform((35, 0))[0]) < 0.5
        # Every two markers apart by more than a marker's size: none covers another.
        lines = [line for group in drawn.values() for line in group]
        for x, y in itertools.combinations(lines, 2):
            distance = ((_at(x) - _at(y)) ** 2).sum() ** 0.5
            assert distance >= _pixels(fig, 8), (x.get_gid(), y.get_gid())


def test_rejected_ops_are_drawn_as_a_grey_cross_the_legend_names(tmp_path):
    # The op log as the engine writes it, read back as the report reads it.
    log = tmp_path / "ops.csv"
    for record in [
        OpRecord(1.0, "tag", "run-2", "resume",
                 str(OpResult(OpOutcome.ERROR, "run-2 is running; only a stopped run can be "
                                               "resumed"))),
        OpRecord(2.0, "tag", "run-1", "stop", str(OpResult(OpOutcome.OK, "stopped at step 20"))),
        # A policy's op overridden by a person's at the same boundary: not a rejection.
        OpRecord(2.0, "policy:SuccessiveHalving", "run-1", "stop",
                 str(OpResult(OpOutcome.SKIPPED, "a person's op on this run wins"))),
        # On a run the report does not know, and an unknown verb: rejected, nowhere to draw
        # the first; the second on run-0's curves.
        OpRecord(3.0, "tag", "run-9", "stop", str(OpResult(OpOutcome.ERROR, "no run named"))),
        OpRecord(4.0, "tag", "run-0", "pause", str(OpResult(OpOutcome.ERROR, "unknown op"))),
    ]:
        append_op_row(record, log)
    data = _data(read_ops(log))

    # By default only the applied ops, as before; the rejected ones when asked.
    assert [(m.run, m.kind, m.rejected) for m in op_markers(data)] == [("run-1", "stop", False)]
    every = op_markers(data, rejected=True)
    assert [(m.run, m.kind, m.rejected) for m in every] == [
        ("run-2", "resume", True), ("run-1", "stop", False), ("run-0", "pause", True)]

    fig, _ = learning_curves_figure(data, "eval_loss")
    for ax in fig.axes:
        drawn = _ops_drawn(ax)
        assert set(drawn) == {"op-rejected:run-2:resume", "op:run-1:stop",
                              "op-rejected:run-0:pause"}
        rejected = [line for line in ax.get_lines() if line.get_label() == REJECTED_LABEL]
        assert {line.get_gid() for line in rejected} == {"op-rejected:run-2:resume",
                                                         "op-rejected:run-0:pause"}
        for line in rejected:
            assert line.get_marker() == "x" and line.get_color() == "0.45"
        assert drawn["op:run-1:stop"][0].get_label() == "stop"
    legend = next(lg for lg in fig.legends if lg.get_title().get_text() == "ops")
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["stop", REJECTED_LABEL]
    assert legend.get_lines()[-1].get_marker() == "x"

    # Given markers are drawn as given: without the rejected ones, no cross and no entry.
    fig, _ = learning_curves_figure(data, None, op_markers(data))
    assert not [line for line in fig.axes[0].get_lines() if line.get_label() == REJECTED_LABEL]
    legend = next(lg for lg in fig.legends if lg.get_title().get_text() == "ops")
    assert [t.get_text() for t in legend.get_texts()] == ["stop"]
