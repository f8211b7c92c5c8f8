"""Reports of a finished (or running) experiment, as text: the runs with chosen metrics, and
the chunk timeline drawn from the schedule."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..config.knobs import describe_value
from ..storage.outside_text import loads
from ..storage.schedule import ChunkRecord
from .display import ELLIPSIS, clip, table
from .kind_metrics import kind_columns
from .results import RunResult

__all__ = ["chunk_timeline", "format_value", "knob_cells", "pareto_front", "results_table",
           "search_rows", "short_name"]

DEFAULT_COLUMNS = {"loss": "loss", "train_loss": "train_loss", "eval_loss": "eval_loss"}
_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz"
# Short names of the knobs people compare most, for tables that must fit a width (the live
# view); others longer than _LONG_NAME are cut to the initials of their words.
_SHORT_NAMES = {
    "learning_rate": "lr", "lr_scheduler_type": "sched", "peft_config": "peft",
    "per_device_train_batch_size": "batch", "gradient_accumulation_steps": "accum",
    "num_train_epochs": "epochs", "weight_decay": "wd", "warmup_steps": "warmup",
    "max_length": "max_len", "max_prompt_length": "max_prompt",
    "max_completion_length": "max_compl", "num_generations": "gens",
}
_LONG_NAME = 12
# A knob value such as LoraConfig(r=8, ...): the knob's name says what it is already.
_WRAPPED = re.compile(r"[A-Za-z_][\w.]*\((.*)\)", re.DOTALL)
# The last-op column of a width-fitted table takes at most this share of the free width.
_OP_SHARE = 4
# A width-fitted table cuts no knob value to fewer characters than this.
_MIN_VALUE = 6


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
    width: int | None = None,
) -> str:
    """One row per run: name (``*`` marks ``best``), status, steps, the latest value of each
    metric in ``columns`` (header -> logged key) and of the trainer kind's own metric
    (:mod:`.kind_metrics`), the knobs and, if any run has one, the
    result of the last op on it (who stopped it, and why).

    With ``width``, lines are kept within that many characters by abbreviating what must be
    (see :func:`knob_cells`): knob names (``lr=``), then knob values (cut where the runs'
    values agree, marked ``…``); the last op is cut at its end, the other columns never."""
    columns = dict(columns or DEFAULT_COLUMNS)
    # The kind's own metric (a reward model's accuracy, a policy's reward), when logged.
    columns.update({h: k for h, k in kind_columns(r.metrics for r in runs).items()
                    if k not in columns.values()})
    ops = any(run.last_op for run in runs)
    headers = ["run", "status", "steps", *columns, "knobs", *(["last op"] if ops else [])]
    fixed = [[run.name + ("*" if run.name == best else ""), run.status.value, run.global_step,
              *(format_value(run.metrics.get(k)) for k in columns.values())] for run in runs]
    last_ops = [_last_op(run.last_op) for run in runs]
    budget = None
    if width is not None and runs:
        # What the fixed columns and their separators take; the knobs (and ops) get the rest.
        used = sum(max(len(str(h)), *(len(str(r[i])) for r in fixed)) + 2
                   for i, h in enumerate(headers[:len(fixed[0])]))
        budget = max(width - used, len("knobs"))
        if ops:
            # The op gets what the knobs in full leave, and at least its share.
            longest = max(len(op) for op in last_ops)
            knobs_need = max(map(len, knob_cells([run.knobs for run in runs])))
            op_width = max(min(longest, max(budget - 2 - knobs_need, budget // _OP_SHARE)),
                           len("last op"))
            last_ops = [clip(op, op_width, keep="head") for op in last_ops]
            budget = max(budget - op_width - 2, len("knobs"))
    knobs = knob_cells([run.knobs for run in runs], budget)
    rows = [[*row, cell, *([op] if ops else [])]
            for row, cell, op in zip(fixed, knobs, last_ops)]
    return table(headers, rows)


def _last_op(text: str | None) -> str:
    text = text or ""
    return text[4:] if text.startswith("ok: ") else text


def short_name(name: str) -> str:
    """A knob's name as a width-fitted table shows it: ``learning_rate`` -> ``lr``,
    ``lr_scheduler_type`` -> ``sched``; other long names by the initials of their words."""
    if name in _SHORT_NAMES:
        return _SHORT_NAMES[name]
    words = [w for w in name.split("_") if w]
    if len(name) > _LONG_NAME and len(words) > 1:
        return "".join(w[0] for w in words)
    return name


def _compact(value: str) -> str:
    """A knob value's text without what only takes room: quotes, spaces after commas, a
    ``Class(...)`` wrapper."""
    value = value.replace("'", "").replace('"', "").replace(", ", ",")
    wrapped = _WRAPPED.fullmatch(value)
    return wrapped.group(1) if wrapped and wrapped.group(1) else value


def knob_cells(knobs: Sequence[Mapping[str, Any]], width: int | None = None) -> list[str]:
    """Each run's knobs as ``name=value`` pairs; with ``width``, abbreviated as little as
    makes every cell fit: short names and compact values first (pairs aligned when every run
    has the same knobs), then the longest values cut in the middle, one character at a time
    (the start and end of a value tell runs apart), finally whole cells at their end."""
    items = [[(k, format_value(v)) for k, v in row.items()] for row in knobs]
    full = ["  ".join(f"{k}={v}" for k, v in row) for row in items]
    if width is None or max(map(len, full), default=0) <= width:
        return full
    names = {k: short_name(k) for row in items for k, _ in row}
    if len(set(names.values())) < len(names):  # two knobs would look alike: keep the names
        names = {k: k for k in names}
    items = [[(names[k], _compact(v)) for k, v in row] for row in items]
    values: dict[str, set[str]] = {}
    for row in items:
        for k, v in row:
            values.setdefault(k, set()).add(v)
    compact = [" ".join(f"{k}={v}" for k, v in row) for row in items]
    if max(map(len, compact)) <= width:
        return compact
    if len(items) > 1:
        # A knob every run gives the same value tells them apart in nothing: it goes first.
        same = {k for k, vs in values.items() if len(vs) == 1 and
                all(any(name == k for name, _ in row) for row in items)}
        items = [[(k, v) for k, v in row if k not in same] for row in items]
        values = {k: vs for k, vs in values.items() if k not in same}
    aligned = len({tuple(k for k, _ in row) for row in items}) == 1
    limits = {k: max(map(len, vs)) for k, vs in values.items()}
    # Values this short (numbers, most names) are never cut.
    floors = {k: min(limit, _MIN_VALUE) for k, limit in limits.items()}
    spans = {k: _common_ends(vs) for k, vs in values.items()}

    def widest() -> int:
        if aligned:
            return sum(len(k) + 1 + limit for k, limit in limits.items()) + len(limits) - 1
        return max(sum(len(k) + 1 + min(len(v), limits[k]) + 1 for k, v in row) - 1
                   for row in items)

    while widest() > width:
        cuttable = [k for k in limits if limits[k] > floors[k]]
        if not cuttable:
            break
        limits[max(cuttable, key=lambda k: limits[k])] -= 1
    cells = [" ".join(f"{k}={_cut(v, limits[k], *spans[k])}".ljust(
        len(k) + 1 + limits[k] if aligned else 0) for k, v in row).rstrip() for row in items]
    return [clip(cell, width, keep="head") for cell in cells]


def _common_ends(values: set[str]) -> tuple[int, int]:
    """How many leading and trailing characters all of ``values`` share (none for one)."""
    if len(values) < 2:
        return 0, 0
    shortest = min(map(len, values))
    head = len(os.path.commonprefix(list(values)))
    tail = len(os.path.commonprefix([v[::-1] for v in values]))
    return head, min(tail, shortest - head)


def _cut(value: str, limit: int, head: int, tail: int) -> str:
    """``value`` in at most ``limit`` characters, showing where the runs' values differ:
    between their common start (``head`` characters) and end (``tail``). With nothing
    common, cut in the middle."""
    if len(value) <= limit:
        return value
    if not head and not tail:
        return clip(value, limit)
    start, end = head, len(value) - tail
    room = limit - 2  # an ellipsis at each end of the window
    if end - start <= room:
        first = (start + end - room) // 2  # the difference, centred
    else:
        first = start - min(start, 2)  # the difference's beginning, just after the common part
    first = max(0, min(first, len(value) - room))
    if first <= 1:
        return value[:limit - 1] + ELLIPSIS
    if first + room >= len(value) - 1:
        return ELLIPSIS + value[len(value) - limit + 1:]
    return ELLIPSIS + value[first:first + room] + ELLIPSIS


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


def pareto_front(events: Sequence[Any]) -> list[str] | None:
    """The runs on a multi-objective search's Pareto front, as the study last computed it
    (``front`` events of ``search.csv``); ``None`` for a search with one objective."""
    fronts = [e.detail for e in events if e.event == "front"]
    return fronts[-1].split() if fronts else None


def search_rows(events: Sequence[Any], start: float | None = None) -> list[list[str]]:
    """An adaptive search's log as rows: trial, run, when it was proposed (seconds after
    ``start``, default the first event), what the sampler chose, and what the study was told
    of it (``-`` while it trains). ``events``: :class:`~.experiment_data.SearchEvent`s."""
    if not events:
        return []
    start = min(e.time for e in events) if start is None else start
    told = {e.run: e.detail for e in events if e.event in ("told", "not told")}
    proposed = {e.run for e in events if e.event == "proposed"}
    rows = []
    for e in events:
        if e.event == "proposed":
            try:
                params = ", ".join(f"{k}={format_value(v)}"
                                   for k, v in loads(e.detail, what="params").items())
            except (ValueError, AttributeError):
                params = e.detail
            rows.append([e.trial, e.run, f"+{e.time - start:.1f} s", params,
                         told.get(e.run, "-")])
        elif e.event == "told" and e.run not in proposed and e.trial:
            rows.append([e.trial, e.run, "(a person's clone)", "", e.detail])
    return rows
