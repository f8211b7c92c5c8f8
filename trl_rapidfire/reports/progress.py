"""What a person watching sees: one progress bar for the whole experiment and a compact table
of the runs, kept up to date at chunk boundaries.

* In a Jupyter kernel: a tqdm widget, and the table as one output refreshed in place.
* In a terminal: one live view, the bar and the table redrawn in place (``rich``); what else
  the process prints meanwhile (warnings, a callback's prints) appears above it.
* Elsewhere (a log file, CI, a pipe, a ``train(blocking=False)`` thread): the tqdm bar, and the
  table printed only now and then (see :class:`LogCadence`) and once at the end.

The table fits :data:`TABLE_WIDTH` columns by abbreviating knobs; ``trl-rapidfire status``
shows them whole. Its rows are the runs in the rotation first, then the others, each part best
first by the experiment's ranking metric (:mod:`.ranking`); in a terminal, the rows that do
not fit its height are left out, and a last line says how many."""

from __future__ import annotations

import html
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from typing import Any, TextIO

from ..shared_state.runs import RunStatus
from .ranking import RankingMetric, default_ranking
from .report import results_table
from .results import RunResult

__all__ = ["TABLE_WIDTH", "ExperimentProgress", "LogCadence", "live_terminal", "ranked_runs",
           "runs_table"]

TABLE_WIDTH = 100
"""The most characters a line of the progress view's runs table takes."""

# How often the not-a-terminal view prints the table: about this many times over the whole
# experiment; when the runs change materially, sooner, but never twice within a third of that
# period or _CHANGE_GAP boundaries, whichever is less (a policy stops runs in bursts).
_LOG_TABLES = 5
_CHANGE_RATE = 3
_CHANGE_GAP = 10
# Statuses a run takes in the ordinary course of the schedule: no reason for a table. (Every
# run completes in the last round, one per boundary; the final table shows them.)
_ON_COURSE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.COMPLETED)
# What the bar and a table's header count: chunks of every run together, not one run's.
_OVER_ALL = "(all runs)"
# Lines of a live view that are not run rows: the bar, the table's header and rule, the cursor.
_LIVE_OVERHEAD = 4


def _now(value: Any) -> Any:
    """``value``, or what it returns when it is a function (lazily built views)."""
    return value() if callable(value) else value


def ranked_runs(runs: Sequence[RunResult], ranking: RankingMetric | None = None
                ) -> list[RunResult]:
    """``runs`` as the table lists them: those in the rotation (running) first, then the
    others, each part best first by ``ranking`` (default: :func:`.ranking.default_ranking`),
    runs without a value last."""
    ranking = ranking or default_ranking(r.metrics for r in runs)
    running = [r for r in runs if r.status is RunStatus.RUNNING]
    others = [r for r in runs if r.status is not RunStatus.RUNNING]
    return [*ranking.best_first(running, lambda r: r.metrics),
            *ranking.best_first(others, lambda r: r.metrics)]


def runs_table(runs: Sequence[RunResult], width: int | None = TABLE_WIDTH, *,
               ranking: RankingMetric | None = None, max_rows: int | None = None) -> str:
    """``run  status  steps  loss  eval_loss  knobs`` (and the ranking metric, when it is
    another) for every run, ordered by :func:`ranked_runs`, in at most ``width`` columns
    (``None``: knobs in full). With ``max_rows``, the rows past it are left out and a last
    line says how many."""
    ranking = ranking or default_ranking(r.metrics for r in runs)
    ordered = ranked_runs(runs, ranking)
    columns = {"loss": "loss", "eval_loss": "eval_loss"}
    # The metric's column, by the key the runs logged it under (``accuracy`` may be
    # ``eval_accuracy``).
    key = next((k for k in ranking.keys if any(k in r.metrics for r in runs)), ranking.key)
    if key not in columns.values():
        columns[key] = key
    left_out = 0
    if max_rows is not None and len(ordered) > max_rows:
        shown = max(max_rows - 1, 1)  # the last line says what was left out
        left_out = len(ordered) - shown
        ordered = ordered[:shown]
    text = results_table(ordered, columns, width=width)
    if left_out:
        text += (f"\n({left_out} more runs, best first by {ranking.key}: "
                 "trl-rapidfire status lists them all)")
    return text


def live_terminal(stream: TextIO) -> bool:
    """Whether a live view may redraw itself in place on ``stream``: it is a terminal that
    moves its cursor (not ``TERM=dumb``), and this is the main thread (a
    ``train(blocking=False)`` thread must not take over a terminal someone types in)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    return (tty and os.environ.get("TERM", "") != "dumb"
            and threading.current_thread() is threading.main_thread())


class LogCadence:
    """When a view that cannot redraw in place prints the runs table, so that a log holds a
    handful of tables, not one per boundary: at the first boundary; then when the runs
    changed materially (a run failed, was stopped or deleted, a clone was added, an op
    answered) and at least ``min_gap`` boundaries passed; else every ``every`` boundaries.
    :meth:`final` says whether the last state still needs printing."""

    def __init__(self, total_chunks: int) -> None:
        self.set_total(total_chunks)
        self.seen = 0
        self._printed_at: int | None = None
        self._printed: tuple[Any, ...] | None = None

    def set_total(self, total_chunks: int) -> None:
        """The experiment has ``total_chunks`` chunks (clones add some)."""
        self.every = max(1, math.ceil(total_chunks / _LOG_TABLES))
        self.min_gap = max(1, min(math.ceil(self.every / _CHANGE_RATE), _CHANGE_GAP))

    @staticmethod
    def state(runs: Sequence[RunResult]) -> tuple[Any, ...]:
        """What counts as a material change: the runs, those stopped, failed or deleted,
        and the ops' answers."""
        return tuple((r.name, "on course" if r.status in _ON_COURSE else r.status.value,
                      r.last_op) for r in runs)

    def due(self, runs: Sequence[RunResult] | Callable[[], Sequence[RunResult]]) -> bool:
        """A boundary passed with ``runs`` as they are now (or what returns them, asked only
        when a table may be due: the runs are many, boundaries more): print the table?"""
        self.seen += 1
        if self._printed_at is not None and self.seen - self._printed_at < self.min_gap:
            return False
        state = self.state(_now(runs))
        if self._printed_at is None:
            due = True
        else:
            gap = self.seen - self._printed_at
            due = gap >= self.every or state != self._printed
        if due:
            self._printed_at, self._printed = self.seen, state
        return due

    def final(self) -> bool:
        """The last boundary's table was not printed: print it (once) at the end."""
        due = self._printed_at is not None and self._printed_at != self.seen
        self._printed_at = self.seen
        return due


def notebook_display() -> Callable[..., Any] | None:
    """IPython's ``display`` when this process is a Jupyter kernel (where a display can be
    updated in place), else ``None`` (a terminal, a script, plain IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    from IPython.display import display

    return display


class ExperimentProgress:
    """The progress bar over every chunk of every run, and the runs table at boundaries.

    In a Jupyter kernel the table is one output, updated in place at every boundary (by its
    display id, so it updates even while ``train(blocking=False)`` runs and other cells
    execute). In a terminal (``stream`` is one, on the main thread) the bar and the table are
    one live view redrawn in place. Elsewhere the table is printed below the tqdm bar when
    :class:`LogCadence` says so, and at the end. Disabled (shows nothing) when ``enabled`` is
    false, e.g. ``disable_tqdm=True``.

    Args:
        total_chunks: the chunks of the whole experiment.
        enabled: show anything at all.
        stream: where the table goes (default ``sys.stdout``).
        ranking: what the table's rows are ordered by (default
            :func:`.ranking.default_ranking`).
    """

    def __init__(self, total_chunks: int, enabled: bool = True, *,
                 stream: TextIO | None = None, ranking: RankingMetric | None = None) -> None:
        self.enabled = enabled
        self.ranking = ranking
        self._bar: Any = None  # tqdm's (notebook and log modes)
        self._live: _LiveView | None = None
        self._display = notebook_display() if enabled else None
        self._table: Any = None  # the notebook output the table lives in
        self._stream = stream or sys.stdout
        self._cadence = LogCadence(total_chunks)
        self.total = total_chunks
        # The latest runs and chunks done (log mode), or what returns them.
        self._last: tuple[Any, Any] | None = None
        # A live or notebook view: when it was last drawn, and what it has not drawn yet.
        self.redraw_seconds = 0.25
        self._drawn_at = -math.inf
        self._pending: tuple[Any, Any] | None = None
        self._pending_done: Any = None  # a log's bar: the count it has not shown yet
        # What returns the experiment's chunk count as it is now (runs stopped by a policy
        # take their untrained chunks out of it), read whenever the count is drawn.
        self._total_now: Callable[[], int] | None = None
        if not enabled:
            return
        if self._display is None and live_terminal(self._stream):
            self._live = _LiveView(total_chunks, self._stream, ranking)
            return
        from tqdm.auto import tqdm

        without_widgets = self._display is not None and find_spec("ipywidgets") is None
        if without_widgets:  # tqdm.auto's notebook bar would warn "IProgress not found"
            from tqdm.std import tqdm
        self._bar = tqdm(total=total_chunks, desc=f"chunks {_OVER_ALL}", unit="chunk",
                         dynamic_ncols=True)
        if without_widgets:
            self._say('the control panel (buttons, live plot) needs ipywidgets: '
                      'pip install ipywidgets')

    @property
    def showing(self) -> bool:
        """Whether anything is shown (callers skip building what would not be)."""
        return self._bar is not None or self._live is not None

    @property
    def mode(self) -> str:
        """``notebook``, ``live`` (a terminal), ``log`` or ``off``."""
        if self._live is not None:
            return "live"
        if self._bar is None:
            return "off"
        return "log" if self._display is None else "notebook"

    def set_total(self, total_chunks: int) -> None:
        """The experiment now has ``total_chunks`` chunks (a clone added some)."""
        self.total = total_chunks
        self._cadence.set_total(total_chunks)
        if self._live is not None:
            self._live.set_total(total_chunks)
        elif self._bar is not None:
            self._bar.total = total_chunks
            self._bar.refresh()

    def begin(self, done: int) -> None:
        """The ``train()`` call starts with ``done`` chunks of the experiment finished. Above
        zero, this call continues an experiment (a re-run on the same output_dir, or a second
        ``train()``): one line says so, since the bar alone would only jump to ``done`` and a
        person could not tell a continued experiment from one trained just now. The bar
        starts at ``done``: its rate and time left count only the chunks this call trains."""
        if done > 0 and self.showing:
            left = ("nothing left to train" if done >= self.total
                    else f"{self.total - done} left")
            self._say(f"continuing: {done} of {self.total} chunks done; {left}")
        if self._live is not None:
            self._live.begin(done)
        elif self._bar is not None:
            self._bar.initial = self._bar.n = done  # tqdm's rate: (n - initial) / elapsed
            self._bar.refresh()

    def _say(self, line: str) -> None:
        """``line`` where the view prints its tables: above a live view, else on the stream
        (through tqdm, so that a bar on the same terminal is not torn)."""
        if self._live is not None:
            self._live.say(line)
        elif self._bar is not None:
            self._bar.write(line, file=self._stream)

    def start(self, run: str) -> None:
        """``run`` starts its turn (shown beside the bar)."""
        if self._live is not None:
            self._live.start(run)
        elif self._bar is not None:
            self._bar.set_postfix_str(run)

    def chunk_done(self, runs: Sequence[RunResult] | Callable[[], Sequence[RunResult]],
                   done: int | Callable[[], int],
                   total: Callable[[], int] | None = None) -> None:
        """A chunk ended; ``done`` chunks of the experiment are finished (by any worker, in
        any session). Each may be given as what returns it: with many runs and short chunks
        a view that redraws in place is redrawn at most every ``redraw_seconds`` (the latest
        state is drawn at :meth:`close`), so that building the table of every run is not a
        cost of every chunk. ``total``: what returns the experiment's chunk count now, read
        when the count is drawn."""
        if not self.showing:
            return
        if total is not None:
            self._total_now = total
        if self._display is None and self._live is None:  # a log: LogCadence decides
            if self._cadence.due(runs):
                self._last = (_now(runs), _now(done))
                self._pending_done = None
                self.set_done(self._last[1])
                self._write_table()
            else:
                self._last = (runs, done)
                now = time.monotonic()
                if now - self._drawn_at >= self.redraw_seconds:
                    self._drawn_at = now
                    self.set_done(_now(done))
                else:
                    self._pending_done = done
            return
        now = time.monotonic()
        if now - self._drawn_at < self.redraw_seconds:
            self._pending = (runs, done)
            return
        self._drawn_at, self._pending = now, None
        self._draw(_now(runs), _now(done))

    def _draw(self, runs: Sequence[RunResult], done: int) -> None:
        self.set_done(done)
        if self._live is not None:
            self._live.show(runs)
            return
        assert self._display is not None  # neither a live view nor a log: a notebook
        text = runs_table(runs, ranking=self.ranking)
        data = {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}
        if self._table is None:
            self._table = self._display(data, raw=True, display_id=True)
        else:
            self._table.update(data, raw=True)

    def set_done(self, done: int) -> None:
        """``done`` chunks of the experiment are finished."""
        if self._total_now is not None and (total := self._total_now()) != self.total:
            self.set_total(total)
        if self._live is not None:
            self._live.set_done(done)
        elif self._bar is not None:
            self._bar.n = done
            self._bar.refresh()

    def close(self) -> None:
        """End the display; the last state stays on screen (a log gets its last table)."""
        if self._pending_done is not None and self._bar is not None:
            self.set_done(_now(self._pending_done))
        if self._pending is not None and (self._live is not None or self._bar is not None):
            pending, self._pending = self._pending, None
            self._draw(_now(pending[0]), _now(pending[1]))
        if self._live is not None:
            self._live.close()
            self._live = None
        if self._bar is not None:
            if self._display is None and self._last is not None and self._cadence.final():
                self._write_table()
            self._bar.close()
            self._bar = None

    def _write_table(self) -> None:
        assert self._last is not None  # written after the latest state was kept
        runs, done = _now(self._last[0]), _now(self._last[1])
        # The count is over all runs (the bar's), the rows' steps each run's own: said, so that
        # "chunks 1/4" above a run at step 2 does not read as that run's chunks.
        table = runs_table(runs, ranking=self.ranking)
        self._bar.write(f"chunks {done}/{self._bar.total} {_OVER_ALL}\n{table}",
                        file=self._stream)


class _LiveView:
    """The terminal's live view: a rich progress bar above the runs table, redrawn in place
    (about once a second, so the elapsed time moves, and at every change). While it is up,
    ``sys.stdout`` and ``sys.stderr`` print above it instead of through it."""

    def __init__(self, total_chunks: int, stream: TextIO,
                 ranking: RankingMetric | None = None) -> None:
        from rich import progress as rp
        from rich.console import Console
        from rich.live import Live

        # The table is plain text: no markup, no highlighting of its numbers.
        self._console = Console(file=stream, force_terminal=True, highlight=False, markup=False)
        self._progress = rp.Progress(
            rp.TextColumn(f"chunks {_OVER_ALL}"), rp.BarColumn(), rp.MofNCompleteColumn(),
            rp.TimeElapsedColumn(), rp.TextColumn("<"), rp.TimeRemainingColumn(),
            rp.TextColumn("{task.fields[run]}", markup=False), console=self._console,
            auto_refresh=False,
        )
        self._task = self._progress.add_task("chunks", total=total_chunks, run="")
        self._table = ""
        self._ranking = ranking
        self._live = Live(get_renderable=self._renderable, console=self._console,
                          refresh_per_second=1, vertical_overflow="ellipsis")
        self._live.start()

    def _renderable(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        if not self._table:
            return self._progress
        return Group(self._progress, Text(self._table, no_wrap=True, overflow="ellipsis"))

    def set_total(self, total_chunks: int) -> None:
        self._progress.update(self._task, total=total_chunks)
        self._live.refresh()

    def start(self, run: str) -> None:
        self._progress.update(self._task, run=run)
        self._live.refresh()

    def set_done(self, done: int) -> None:
        self._progress.update(self._task, completed=done)
        self._live.refresh()

    def begin(self, done: int) -> None:
        """Start the count at ``done`` without taking it for progress made now (rich's time
        left is from the samples of the updates since)."""
        self._progress.reset(self._task, completed=done, run="")
        self._live.refresh()

    def show(self, runs: Sequence[RunResult]) -> None:
        # What fits under the bar: the terminal's height less the bar, the table's header and
        # rule, and a line for the cursor (rich would cut the rest at the bottom, where the
        # best runs and the running ones were).
        self._table = runs_table(runs, min(TABLE_WIDTH, self._console.width),
                                 ranking=self._ranking,
                                 max_rows=max(self._console.height - _LIVE_OVERHEAD, 2))
        self._live.refresh()

    def say(self, line: str) -> None:
        """A line above the view (it stays when the view is redrawn)."""
        self._console.print(line, soft_wrap=True)

    def close(self) -> None:
        self._progress.update(self._task, run="")  # no run is training any more
        self._live.stop()
