"""Handoffs: the switching a user reads from schedule.csv, per worker."""

from __future__ import annotations

import pytest

from trl_rapidfire.storage.schedule import ChunkRecord, Handoffs


def _row(run: str, start: float, end: float, worker: int = 0) -> ChunkRecord:
    return ChunkRecord(run=run, epoch=0, chunk=0, number=0, worker=worker, start_time=start,
                       end_time=end, start_step=0, end_step=1)


def test_gaps_are_between_one_workers_chunks_in_time_order():
    rows = [_row("run-1", 1.1, 2.0), _row("run-0", 0.0, 1.0), _row("run-2", 2.5, 3.5),
            _row("run-3", 0.0, 9.0, worker=1)]  # another worker's chunk overlaps: not a gap
    hand = Handoffs.of(rows)
    assert hand.gaps == pytest.approx((0.1, 0.5)) and hand.chunks == 3
    assert hand.busy == pytest.approx(2.9)
    assert hand.share == pytest.approx(0.6 / 2.9) and hand.mean_gap == pytest.approx(0.3)
    assert Handoffs.of(rows, worker=1).gaps == () and Handoffs.of([]).share == 0.0


def test_rows_appended_through_a_kept_descriptor_follow_a_rewritten_file(tmp_path):
    """The appender keeps schedule.csv open between chunks; when a worker that registered
    rewrote the file whole, later rows go to the new file, and never through a link."""
    from trl_rapidfire.storage.own_files import LinkRefused
    from trl_rapidfire.storage.schedule import (
        ChunkRecord,
        ScheduleAppender,
        read_schedule_csv,
        write_schedule_csv,
    )

    path = tmp_path / "schedule.csv"
    rows = [ChunkRecord(f"run-{i}", 0, i, i, 0, float(i), i + 0.5, 2 * i, 2 * i + 2)
            for i in range(4)]
    write_schedule_csv([], path)
    appender = ScheduleAppender(path)
    appender.append(rows[0])
    appender.append(rows[1])
    assert read_schedule_csv(path) == rows[:2]
    write_schedule_csv(rows[:1], path)  # rewritten whole (a new file at the path)
    appender.append(rows[2])
    assert read_schedule_csv(path) == [rows[0], rows[2]]
    path.unlink()
    (tmp_path / "elsewhere.csv").write_text("")
    path.symlink_to(tmp_path / "elsewhere.csv")
    with pytest.raises(LinkRefused):
        appender.append(rows[3])
    assert (tmp_path / "elsewhere.csv").read_text() == ""
    appender.close()
