"""Times in ops.csv and schedule.csv are ISO-8601 UTC text a person can read; files written
before (``time.time()`` floats) still load, and a record equals its row read back."""

from __future__ import annotations

import csv
import random
import re
import time
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from trl_rapidfire.control.ops import OpRecord, append_op_row
from trl_rapidfire.reports.experiment_data import read_ops
from trl_rapidfire.storage.csv_logs import utc_seconds, utc_text, whole_micros
from trl_rapidfire.storage.schedule import (
    ChunkRecord,
    ScheduleAppender,
    read_schedule_csv,
    write_schedule_csv,
)

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _record(number: int, start: float) -> ChunkRecord:
    return ChunkRecord(run="run-0", epoch=0, chunk=number, number=number, worker=0,
                       start_time=start, end_time=start + 0.0123456789, start_step=2 * number,
                       end_step=2 * number + 2)


def test_schedule_times_are_iso_utc_text_and_read_back_equal(tmp_path):
    path = tmp_path / "schedule.csv"
    now = time.time()
    first, second = _record(0, now), _record(1, now + 1.5)
    write_schedule_csv([first], path)
    appender = ScheduleAppender(path)
    appender.append(second)
    appender.close()
    rows = _rows(path)
    assert all(ISO.fullmatch(row[key]) for row in rows for key in ("start_time", "end_time"))
    when = datetime.fromisoformat(rows[0]["start_time"])
    assert when.tzinfo == UTC and abs(when.timestamp() - now) < 1e-6
    assert read_schedule_csv(path) == [first, second]  # to the microsecond, both ways
    assert abs(first.seconds - 0.0123456789) < 1.1e-6  # each end to the microsecond


def test_a_schedule_written_with_float_times_still_loads_and_is_rewritten_as_text(tmp_path):
    path = tmp_path / "schedule.csv"
    path.write_text("run,epoch,chunk,number,worker,start_time,end_time,start_step,end_step,"
                    "steps\nrun-0,0,0,0,0,1796497023.25,1796497024.5,0,2,2\n"
                    "run-0,0,1,1,0,nan,1796497025.5,2,4,2\n"  # no time: skipped
                    "run-1,0,0,0,0,1796497024.5,2026-12-05T18:57:06.000001Z,0,2,2\n")
    rows = read_schedule_csv(path)
    assert [(r.run, r.start_time, r.end_time) for r in rows] == [
        ("run-0", 1796497023.25, 1796497024.5), ("run-1", 1796497024.5, 1796497026.000001)]
    write_schedule_csv(rows, path)  # what registering a re-run does
    assert _rows(path)[0]["start_time"] == "2026-12-05T18:57:03.250000Z"
    assert read_schedule_csv(path) == rows


def test_ops_times_are_iso_utc_text_and_an_old_float_log_still_reads(tmp_path):
    path = tmp_path / "ops.csv"
    record = OpRecord.now("python", "run-1", "stop", "ok: stopped at step 4")
    append_op_row(record, path)
    cell = _rows(path)[0]["time"]
    assert ISO.fullmatch(cell) and abs(utc_seconds(cell) - record.time) < 1e-6
    [event] = read_ops(path)
    assert (event.run, event.op, event.step) == ("run-1", "stop", 4)
    assert abs(event.time - record.time) < 1e-6

    old = tmp_path / "old-ops.csv"
    old.write_text("time,source,run,op,result\n1796497023.5,tag,run-0,stop,ok: stopped\n"
                   "soon,tag,run-1,stop,ok: stopped\n")  # not a time: skipped
    assert [(e.time, e.run) for e in read_ops(old)] == [(1796497023.5, "run-0")]
    assert utc_text(1796497023.5) == "2026-12-05T18:57:03.500000Z"


def test_a_time_that_could_not_be_written_back_is_no_time():
    import pytest

    for bad in ("9999-12-31T23:59:59-01:00", "nan", "1e300"):  # past year 9999 once in UTC
        with pytest.raises(ValueError, match="is not a time"):
            utc_seconds(bad)
    assert utc_text(utc_seconds("9999-12-31T23:59:59+01:00")) == "9999-12-31T22:59:59.000000Z"


def test_times_are_the_text_and_microseconds_of_exact_rounding():
    # The row's time is formatted twice a chunk: integer arithmetic and gmtime, checked
    # against the exact reference (a Fraction rounded half to even, datetime's strftime).
    def reference(seconds: float) -> tuple[str, float]:
        micros = round(Fraction(seconds) * 1_000_000)
        when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
        return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), micros / 1_000_000

    rng = random.Random(0)
    now = time.time()
    samples = [0.0, 0.5e-6, 1.5e-6, 2.5e-6, now, round(now, 6), -1.25e-6, -86_400.5e0]
    samples += [now + rng.uniform(-1e9, 1e9) for _ in range(2000)]
    samples += [rng.randint(0, 4 * 10**15) * 0.5e-6 for _ in range(2000)]  # exact halves
    for seconds in samples:
        assert (utc_text(seconds), whole_micros(seconds)) == reference(seconds), seconds


def test_a_chunks_row_is_the_csv_modules_row_for_every_name_and_number():
    """The row appended at each chunk's end is formatted directly: it must be the csv module's
    row byte for byte, a name that needs quoting included (those take the csv module's path)."""
    from trl_rapidfire.storage.schedule import _csv_row_text, _row_text

    rnd = random.Random(5)
    names = ["run-0", "run-17", "a,b", 'say "hi"', "line\nbreak", "tab\there", "é-run", " x "]
    for name in names:
        for _ in range(50):
            start = rnd.uniform(0, 4e9)
            record = ChunkRecord(run=name, epoch=rnd.randrange(3), chunk=rnd.randrange(99),
                                 number=rnd.randrange(10**6), worker=rnd.randrange(64),
                                 start_time=start, end_time=start + rnd.uniform(0, 1e4),
                                 start_step=(s := rnd.randrange(10**7)),
                                 end_step=s + rnd.randrange(1000))
            assert _row_text(record) == _csv_row_text(record)
