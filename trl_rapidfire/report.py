"""Reports of a finished (or running) experiment, as text: the runs with chosen metrics, and
the chunk timeline drawn from the schedule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .display import table
from .knobs import describe_value
from .results import RunResult
from .schedule import ChunkRecord

__all__ = ["chunk_timeline", "format_value", "results_table"]

DEFAULT_COLUMNS = {"loss": "loss", "train_loss": "train_loss", "eval_loss": "eval_loss"}
_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz"


def format_value(value: Any) -> str:
    """Floats to 4 significant digits, knob values in their short form, ``-`` for missing."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, (int, str)):
        return str(value)
    return describe_value(value)


def results_table(
    runs: Sequence[RunResult],
    columns: Mapping[str, str] | None = None,
    *,
    best: str | None = None,
) -> str:
    """One row per run: name (``*`` marks ``best``), status, steps, the latest value of each
    metric in ``columns`` (header -> logged key), the knobs and, if any run has one, the
    result of the last op on it (who stopped it, and why)."""
    columns = dict(columns or DEFAULT_COLUMNS)
    ops = any(run.last_op for run in runs)
    rows = []
    for run in runs:
        knobs = "  ".join(f"{k}={format_value(v)}" for k, v in run.knobs.items())
        row = [run.name + ("*" if run.name == best else ""), run.status.value,
               run.global_step, *(format_value(run.metrics.get(k)) for k in columns.values()),
               knobs]
        if ops:
            last = run.last_op or ""
            row.append(last[4:] if last.startswith("ok: ") else last)
        rows.append(row)
    return table(["run", "status", "steps", *columns, "knobs", *(["last op"] if ops else [])],
                 rows)


def chunk_timeline(
    runs: Sequence[RunResult], schedule: Sequence[ChunkRecord], *, steps: bool = False
) -> str:
    """One line per run; column t is the t-th chunk the experiment trained, showing the run's
    own chunk number where that run trained it, else a dot. Then the run's turns (or, with
    ``steps``, the step span of each of its chunks) and its training seconds."""
    width = max((len(run.name) for run in runs), default=0)
    lines = []
    for run in runs:
        mine = [(t, c) for t, c in enumerate(schedule) if c.run == run.name]
        cells = "".join(
            (_SYMBOLS[c.number] if c.number < len(_SYMBOLS) else "#") if c.run == run.name
            else "." for c in schedule
        )
        if steps:
            where = "steps " + " ".join(f"[{c.start_step},{c.end_step})" for _, c in mine)
        else:
            where = "turns " + ",".join(str(t + 1) for t, _ in mine)
        seconds = sum(c.seconds for _, c in mine)
        lines.append(f"{run.name:<{width}}  {cells}  {where}  ({seconds:.1f} s)")
    return "\n".join(lines)
