"""The experiment's control panel in a Jupyter notebook: ``trainer.panel()``.

The progress view (:mod:`.progress`) only shows; here a person also steers: each run's row
(:mod:`.notebook_rows`) holds its cells and its Stop / Resume / Delete / Clone buttons and
the answer to the op asked with them; a clone form (:mod:`.notebook_form`); the training loss
by the browser panel's curve rules (:mod:`.notebook_curves`); filters by text and status over
both. All kept up to date at chunk boundaries while other cells run (or while a blocking
``train()`` keeps the kernel busy). The finished preprocessing bars that building the runs
left in the cell are collapsed (:mod:`.notebook_bars`).

The curves come first, under the header: with a hundred runs the table is long, and it
scrolls in a box of its own. A button's click acts even while a blocking ``train()`` or
``wait()`` keeps the kernel busy: the cell reads the clicks at every chunk boundary
(:mod:`.notebook_events`). A clicked button stays pressed, and its row says the op is queued,
until the experiment applies or refuses it (:mod:`.notebook_buttons`).

The panel knows the trainer only through :class:`~.notebook_form.PanelTrainer`, the
trainer's public face (its runs, ops, op log and schedule), so it never depends on how the
engine is built. It needs ``ipywidgets`` (the ``notebook`` extra), imported only when a panel
is made, so the rest of the package never needs it.
"""

from __future__ import annotations

import html
import importlib.util
import threading
from collections.abc import Sequence
from typing import Any

from ..control.ops import OpRecord
from ..shared_state.runs import shown_status
from .notebook_bars import finished_preprocessing_bars, show_bars
from .notebook_curves import loss_png
from .notebook_form import (
    AskedOp,
    CloneForm,
    PanelTrainer,
    answer_of,
    error_html,
    muted_html,
    widgets,
)
from .notebook_rows import RunControls, RunsTable
from .progress import notebook_display
from .ranking import RankingMetric, default_ranking
from .results import RunResult

__all__ = ["NotebookPanel", "PanelTrainer", "RunControls", "panel_can_show"]


class NotebookPanel:
    """A live view of an experiment that steers it: a header (chunks trained of all), the
    filters, the runs table (a row per run with its buttons and their answer), a clone form
    and the training loss.

    A daemon thread polls the trainer cheaply (the lengths of the schedule and the op log,
    and whether it trains) every ``interval`` seconds and refreshes the widgets when they
    changed, so the panel updates at chunk boundaries without a busy kernel: ipywidgets send
    their updates from any thread. The thread ends once training has ended and the final
    state is drawn (:meth:`refresh` or a button starts it again if the trainer trains
    again); :meth:`close` ends it and removes the widgets.

    Args:
        trainer: what it shows and steers (see :class:`PanelTrainer`).
        interval: seconds between polls.
        poll: refresh by itself (``False``: only on :meth:`refresh` and clicks).
    """

    def __init__(self, trainer: PanelTrainer, *, interval: float = 0.5,
                 poll: bool = True) -> None:
        w = widgets()
        self._trainer = trainer
        self.interval = interval
        self.refreshes = 0
        """How many times the panel was redrawn."""
        self.error: BaseException | None = None
        """The last error a refresh by the polling thread met (it polls on)."""
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._poll = poll
        self._drawn: tuple[Any, ...] | None = None
        self._seen_training = False
        self._plotted: tuple[int, int] | None = None
        self._curves: dict[str, list[tuple[int, float]]] = {}
        self._curve_steps: dict[str, int] = {}  # each run's step when its curve was read
        self._asked: dict[str, AskedOp] = {}
        self.header = w.HTML()
        self.bar = w.IntProgress(min=0, max=1, value=0, description="chunks",
                                 layout=w.Layout(width="260px"))
        self.table = RunsTable(self.ask, self._choose_clone, self._filters_changed)
        self.rows: dict[str, RunControls] = self.table.rows
        """Each run's row (its cells, buttons and answer line), by run name."""
        # Shown at its own size (700 px, the figure's): scaled up, it blurs.
        self.plot = w.Image(format="png", layout=w.Layout(width="700px", display="none"))
        self.form = CloneForm(trainer, on_asked=self._asked_clone)
        self.bars: list[Any] = []
        """The finished preprocessing bars collapsed (see :mod:`.notebook_bars`)."""
        self.show_bars = w.ToggleButton(value=False, layout=w.Layout(width="auto",
                                                                      display="none"))
        self.show_bars.observe(lambda _change: self._collapse_bars(), names="value")
        # The curves at the top, in sight whatever the number of runs; then the table.
        self.widget = w.VBox([w.HBox([self.bar, self.header, self.show_bars],
                                     layout=w.Layout(flex_flow="row wrap")),
                              self.plot, self.table.widget, self.form.widget])
        self.refresh()

    # ------------------------------------------------------------------ showing

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """Shown as its widget when a cell ends with it."""
        return self.widget._repr_mimebundle_(**kwargs)

    def show(self) -> None:
        """Show the panel as an output of the running cell (as a cell ending with it would),
        and keep it refreshing while the trainer trains."""
        display = notebook_display()
        if display is not None:
            display(self)
        self.refresh()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` removed the panel."""
        return self._closed.is_set()

    def refresh(self) -> None:
        """Redraw from the trainer's state now (and start polling if it trains)."""
        with self._lock:
            if self._closed.is_set():
                return
            trainer = self._trainer
            signature = self._signature()
            runs = self._best_first(list(trainer.runs))
            log = list(trainer.op_log)
            self._draw_header(runs, signature[0], signature[2])
            self.form.set_runs(runs)
            self.table.update(runs, signature[2])
            self._draw_answers(runs, log)
            self._draw_plot(runs, signature[0])
            self._collapse_bars()
            self._drawn = signature
            # Training seen, by a poll or a refresh: its end, once drawn, ends the polling.
            self._seen_training = self._seen_training or signature[2]
            self.refreshes += 1
        self._start_polling()

    def _ranking(self, runs: Sequence[RunResult]) -> RankingMetric:
        """The experiment's ranking metric (the trainer's, as every view of it uses), else
        eval loss where every run has one, else the loss."""
        ranking = getattr(self._trainer, "ranking", None)
        return ranking if isinstance(ranking, RankingMetric) else default_ranking(
            run.metrics for run in runs)

    def _best_first(self, runs: list[RunResult]) -> list[RunResult]:
        """The rows' order: best first by the ranking metric, runs without a value last."""
        return self._ranking(runs).best_first(runs, lambda run: run.metrics)

    def _signature(self) -> tuple[int, int, bool]:
        """What changes at a boundary, cheap to read: chunks trained, ops answered, training."""
        trainer = self._trainer
        return len(trainer.schedule), len(trainer.op_log), bool(trainer.training)

    def _draw_header(self, runs: Sequence[RunResult], done: int, training: bool) -> None:
        total = _total_chunks(self._trainer)
        counts: dict[str, int] = {}
        for run in runs:
            shown = shown_status(run.status, training=training)
            counts[shown] = counts.get(shown, 0) + 1
        state = ", ".join(f"{n} {status}" for status, n in counts.items())
        of = f" of {total}" if total is not None else ""
        self.header.value = (f"<b>{done}</b>{of} chunks trained &middot; {len(runs)} runs "
                             f"({html.escape(state)}) &middot; "
                             f"{'training' if training else 'not training'}")
        self.bar.max = max(total if total is not None else done, 1)
        self.bar.value = min(done, self.bar.max)

    def _draw_answers(self, runs: Sequence[RunResult], log: Sequence[OpRecord]) -> None:
        """Each run's answer line: the experiment's answer to the op a button asked, which
        lets its button go; while there is none the op is pending, its button held."""
        for run in runs:
            row, asked = self.rows.get(run.name), self._asked.get(run.name)
            if row is None or asked is None or self.table.confirm.armed(run.name):
                continue
            record = answer_of(asked, run.name, log)
            button = row.button(asked.verb)
            if record is not None:
                text = f"{record.op}: {record.result}"
                style = error_html if not record.result.startswith("ok") else html.escape
                _say(row, style(text), text)
                if button is not None and button.held:
                    button.release()
            elif not self._trainer.training:
                text = f"{asked.verb}: queued for the next train()"
                _say(row, muted_html(text), f"{text}: nothing trains now; it is applied (or "
                     "refused) when train() runs again")
            else:
                _say(row, *_queued(asked.verb))

    def _collapse_bars(self) -> None:
        """Hide the finished preprocessing bars (new ones too: a clone builds a trainer),
        unless the toggle shows them; the toggle says how many there are."""
        bars = finished_preprocessing_bars()
        known = {id(bar) for bar in self.bars}
        self.bars += [bar for bar in bars if id(bar) not in known]
        show_bars(self.bars, bool(self.show_bars.value))
        if self.bars:
            verb = "hide" if self.show_bars.value else "show"
            self.show_bars.description = f"{verb} {len(self.bars)} preprocessing bars"
            self.show_bars.layout.display = ""

    def _draw_plot(self, runs: Sequence[RunResult], done: int) -> None:
        """Redraw the curves when a chunk was trained (the plot is the costly part of a
        refresh: only new chunks change it), reading the whole logged history of the runs
        whose step moved since (at most the runs that trained a chunk since the last draw)."""
        key = (done, len(runs))
        if key == self._plotted:
            return
        for run in runs:
            if self._curve_steps.get(run.name) != run.global_step:
                self._curve_steps[run.name] = run.global_step
                self._curves[run.name] = self._trainer.metric_history(run.name, "loss")
        self._plotted = key
        shown = {name: self._curves.get(name, []) for name in self.table.shown}
        ranking = self._ranking(runs)
        # The colours go to the best by the ranking metric (the table's order), not by loss.
        top = [run.name for run in ranking.best_first(runs, lambda run: run.metrics)
               if run.name in shown and ranking.value_of(run.metrics) is not None]
        if any(self._curves.values()):  # filtered down to none: empty axes, not stale lines
            self.plot.value = loss_png(shown, top=top)
            self.plot.layout.display = ""  # hidden until there is a curve to draw

    def _filters_changed(self) -> None:
        """The filters moved: the curves show the runs the table shows."""
        with self._lock:
            self._plotted = None
            self._draw_plot(list(self._trainer.runs), len(self._trainer.schedule))

    # ------------------------------------------------------------------ steering

    def ask(self, run: str, verb: str) -> None:
        """Queue ``verb`` (``stop``, ``resume`` or ``delete``) on ``run``, as its button
        does: the button stays pressed and the run's answer line says the op is queued until
        the experiment's answer arrives (then shown)."""
        with self._lock:
            row = self.rows.get(run)
            button = row.button(verb) if row is not None else None
            try:
                log_from = len(self._trainer.op_log)
                getattr(self._trainer, verb)(run)
            except Exception as err:  # noqa: BLE001 - shown to the person who clicked
                if row is not None:
                    _say(row, error_html(f"{verb}: {err}"), f"{verb}: {err}")
                if button is not None:
                    button.release()
                return
            self._asked[run] = AskedOp(verb, log_from)
            if button is not None:
                button.hold()
            if row is not None:
                _say(row, *_queued(verb))
        self.refresh()

    def _asked_clone(self, run: str, asked: AskedOp) -> None:
        """The form queued a clone of ``run``: its answer shows in that run's line too."""
        with self._lock:
            self._asked[run] = asked
            row = self.rows.get(run)
            if row is not None:
                _say(row, *_queued(asked.verb))
        self.refresh()

    def _choose_clone(self, run: str) -> None:
        """A run's Clone button: the form, set to clone that run."""
        self.form.source.value = run
        self.form.fill(run)

    # ------------------------------------------------------------------ polling

    @property
    def polling(self) -> bool:
        """Whether the panel still refreshes by itself (false once training ended and its
        final state is drawn, or after :meth:`close`)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _start_polling(self) -> None:
        if not self._poll or self._closed.is_set():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            if self._thread is not None and not self._trainer.training:
                return  # it ended after the final state was drawn; nothing trains now
            self._thread = threading.Thread(target=self._polling, daemon=True,
                                            name="trl-rapidfire-panel")
            self._thread.start()

    def _polling(self) -> None:
        while not self._closed.wait(self.interval):
            try:
                signature = self._signature()
                self._seen_training = self._seen_training or signature[2]
                if signature != self._drawn:
                    self.refresh()
            except Exception as err:  # noqa: BLE001 - the panel polls on; kept for a look
                self.error = err
                continue
            if self._seen_training and not signature[2]:
                return  # training ended, and its final state is drawn

    def close(self) -> None:
        """Stop refreshing and remove the panel's widgets."""
        self._closed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            _close_all(self.widget)


def panel_can_show() -> bool:
    """Whether a panel can show here: a Jupyter kernel, with ipywidgets installed."""
    return notebook_display() is not None and importlib.util.find_spec("ipywidgets") is not None


def _total_chunks(trainer: Any) -> int | None:
    """The experiment's chunks in all, where the trainer says (an RF trainer's engine does:
    clones add chunks); else unknown, and the header shows the chunks trained alone."""
    total = getattr(getattr(trainer, "engine", None), "total_chunks", None)
    return total if isinstance(total, int) and not isinstance(total, bool) else None


def _queued(verb: str) -> tuple[str, str]:
    """A queued op's answer line and its tooltip."""
    text = f"{verb}: queued, applies at the next chunk boundary"
    return muted_html(text), (f"{text} (while a blocking train() or wait() runs in this "
                              "kernel too: the clicks are read at every chunk boundary)")


def _say(row: RunControls, value: str, tooltip: str) -> None:
    """A run's answer line: one line (cut where the row is narrow), whole in its tooltip."""
    with row.answer.hold_sync():  # one message
        row.answer.value, row.answer.tooltip = value, tooltip


def _close_all(widget: Any) -> None:
    for child in getattr(widget, "children", ()):
        _close_all(child)
    widget.close()
