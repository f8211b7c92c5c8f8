"""The notebook panel's runs table (:mod:`.notebook_panel`): a row per run, each an
``ipywidgets.HBox`` of its cells and its own Stop / Resume / Delete / Clone buttons and the
answer to the last op asked with them; and the filters (text over names and knob values, and
the statuses shown) that narrow the table and the curves.

Its columns are the browser panel's (``client/panel_static/panel_table.js``) and the CLI's
``status``: the run, its status, steps and losses, the knobs that differ between the runs (a
knob holding a config object by its fields: :func:`~.knob_fields.expand_knobs`, at most
:data:`MAX_KNOB_COLUMNS`, each value cut to :data:`KNOB_CHARS` with the whole in its tooltip)
and the last op's result. Rows are made once per run and updated in place; a column is as
wide as its longest cell, in every row, so the rows line up as a table's.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..shared_state.runs import RunStatus, shown_status
from .display import clip, differing_keys
from .kind_metrics import kind_columns
from .knob_fields import expand_knobs
from .notebook_form import widgets
from .report import format_value
from .results import RunResult

__all__ = ["KNOB_CHARS", "MAX_KNOB_COLUMNS", "RunControls", "RunsTable", "table_columns"]

MAX_KNOB_COLUMNS = 8  # the browser panel's
KNOB_CHARS = 30  # the CLI status's cut: a LoRA field's list of targets stays readable
_FIXED = ("run", "status", "steps", "loss", "eval_loss")
_LAST = "last op"
# Statuses the Stop button makes sense in (the buttons of the others are disabled, so a click
# never asks for what the op desk would refuse anyway).
_STOPPABLE = (RunStatus.PENDING, RunStatus.RUNNING)
# The status filters' order: as a run goes.
_STATUS_ORDER = ("pending", "running", "interrupted", "stopped", "completed", "failed",
                 "deleted")
_CHAR_PX = 7.5  # a character of the notebook's table font, and a cell's padding
_PAD_PX = 14
_FILTER_CHARS = 200  # the browser panel's bound on the filter text
# Cells and buttons keep their width: a long answer line must not squeeze its row's cells
# out of line with the other rows' (it wraps instead).
_FIXED_SIZE = "0 0 auto"


@dataclass
class RunControls:
    """One run's row: its cells (an ``ipywidgets.HBox`` of ``HTML``, in the table's column
    order), its buttons, the answer to the last op asked with them, and the row (``widget``).
    """

    stop: Any
    resume: Any
    delete: Any
    clone: Any
    answer: Any
    widget: Any
    cells: Any = None
    texts: list[str] = field(default_factory=list)
    """The cells' texts as shown (cut), in column order."""


def table_columns(runs: Sequence[RunResult]) -> tuple[list[str], list[dict[str, Any]]]:
    """The knob columns of the table of ``runs`` and each run's knobs with its config objects
    by their fields: ``(knob names, expanded knobs per run)``."""
    expanded = expand_knobs([run.knobs for run in runs])
    return differing_keys(expanded)[:MAX_KNOB_COLUMNS], expanded


class RunsTable:
    """The rows of the panel's runs, their column headers and the filters over them.

    Args:
        on_op: called with ``(run, verb)`` when a run's Stop / Resume / Delete is clicked.
        on_clone: called with the run when its Clone button is clicked.
        on_filter: called (no arguments) when the filters change which runs are shown.
    """

    def __init__(self, on_op: Callable[[str, str], None], on_clone: Callable[[str], None],
                 on_filter: Callable[[], None]) -> None:
        w = widgets()
        self._on_op, self._on_clone, self._on_filter = on_op, on_clone, on_filter
        self.rows: dict[str, RunControls] = {}
        self.headers: list[str] = []
        self.shown: list[str] = []
        """The runs the filters let through, in the table's order."""
        self._runs: list[RunResult] = []
        self._training = False
        self._search: dict[str, str] = {}  # run -> the text the filter words are looked for in
        self._header = w.HBox()
        self._body = w.VBox()
        self.filter = w.Text(placeholder="filter: words in a run's name or knob values",
                             layout=w.Layout(width="320px"))
        self.statuses: dict[str, Any] = {}
        """A checkbox per status the runs have: unticked, its runs are hidden."""
        self._status_box = w.HBox()
        self.count = w.HTML()
        self.filter.observe(lambda _change: self._filtered(), names="value")
        self.widget = w.VBox([w.HBox([self.filter, self._status_box, self.count]),
                              self._header, self._body])

    # ------------------------------------------------------------------ drawing

    def update(self, runs: Sequence[RunResult], training: bool) -> None:
        """Draw ``runs``: new rows for new runs, every cell and button state brought up to
        date, the columns sized to their cells, the filters applied."""
        w = widgets()
        self._runs, self._training = list(runs), training
        knobs, expanded = table_columns(runs)
        kind = kind_columns(run.metrics for run in runs)  # a reward model's accuracy, ...
        headers = [*_FIXED, *kind, *knobs, _LAST]
        texts: dict[str, list[tuple[str, str]]] = {}
        for run, values in zip(runs, expanded):
            whole = [run.name, shown_status(run.status, training=training),
                     str(run.global_step), format_value(run.metrics.get("loss")),
                     format_value(run.metrics.get("eval_loss")),
                     *(format_value(run.metrics.get(k)) for k in kind.values()),
                     *(format_value(values.get(k)) for k in knobs), run.last_op or ""]
            texts[run.name] = [(clip(t, KNOB_CHARS, keep="head" if i == len(whole) - 1
                                     else "ends"), t) for i, t in enumerate(whole)]
            self._search[run.name] = " ".join(
                [run.name, *(f"{k}={format_value(v)}" for k, v in values.items())]).lower()
        widths = [max([len(h), *(len(row[i][0]) for row in texts.values())])
                  for i, h in enumerate(headers)]
        layouts = [f"{round(n * _CHAR_PX + _PAD_PX)}px" for n in widths]
        if headers != self.headers:
            self.headers = headers
            self._header.children = [w.HTML(f"<b>{html.escape(h)}</b>",
                                            layout=w.Layout(width=px, flex=_FIXED_SIZE))
                                     for h, px in zip(headers, layouts)] + [
                                         w.HTML("<b>ops</b>")]
        else:
            _set_widths(self._header.children, layouts)
        for run in runs:
            row = self.rows.get(run.name)
            if row is None:
                row = self.rows[run.name] = self._new_row(run.name)
                self._body.children = [r.widget for r in self.rows.values()]
            _set_cells(row, texts[run.name], layouts)
            row.stop.disabled = run.status not in _STOPPABLE
            row.resume.disabled = run.status != RunStatus.STOPPED
            row.delete.disabled = row.clone.disabled = run.status == RunStatus.DELETED
        self._draw_status_filters(
            {shown_status(run.status, training=training) for run in runs})
        self._apply_filters()

    def _new_row(self, run: str) -> RunControls:
        w = widgets()
        buttons = {verb: w.Button(description=verb.capitalize(), tooltip=f"{verb} {run}",
                                  layout=w.Layout(width="80px", flex=_FIXED_SIZE))
                   for verb in ("stop", "resume", "delete", "clone")}
        for verb in ("stop", "resume", "delete"):
            buttons[verb].on_click(lambda _b, v=verb: self._on_op(run, v))
        buttons["clone"].on_click(lambda _b: self._on_clone(run))
        # Beside the buttons where it fits, else on a line of its own under them.
        answer = w.HTML(layout=w.Layout(flex="1 1 auto", min_width="240px"))
        cells = w.HBox(layout=w.Layout(flex=_FIXED_SIZE))
        widget = w.HBox([cells, *buttons.values(), answer],
                        layout=w.Layout(align_items="center", flex_flow="row wrap"))
        return RunControls(answer=answer, widget=widget, cells=cells, **buttons)

    def _draw_status_filters(self, present: set[str]) -> None:
        w = widgets()
        new = sorted(present - set(self.statuses),
                     key=lambda s: (_STATUS_ORDER.index(s) if s in _STATUS_ORDER else 99, s))
        if not new:
            return
        for status in new:
            box = w.Checkbox(value=True, description=status, indent=False,
                             layout=w.Layout(width="auto"))
            box.observe(lambda _change: self._filtered(), names="value")
            self.statuses[status] = box
        order = sorted(self.statuses, key=lambda s: (
            _STATUS_ORDER.index(s) if s in _STATUS_ORDER else 99, s))
        self._status_box.children = [self.statuses[s] for s in order]

    # ------------------------------------------------------------------ filtering

    def is_shown(self, run: RunResult) -> bool:
        """Whether the filters let ``run`` through: its status ticked, and every word of the
        filter text in its name or one of its knob values (``key=value``, case-insensitive),
        as in the browser panel."""
        box = self.statuses.get(shown_status(run.status, training=self._training))
        if box is not None and not box.value:
            return False
        words = self.filter.value[:_FILTER_CHARS].lower().split()
        text = self._search.get(run.name, run.name.lower())
        return all(word in text for word in words)

    def _apply_filters(self) -> None:
        self.shown = [run.name for run in self._runs if self.is_shown(run)]
        shown = set(self.shown)
        for name, row in self.rows.items():
            display = "" if name in shown else "none"
            if row.widget.layout.display != display:
                row.widget.layout.display = display
        self.count.value = (f"{len(self.shown)} of {len(self._runs)} runs shown"
                            if len(self.shown) != len(self._runs) else "")

    def _filtered(self) -> None:
        self._apply_filters()
        self._on_filter()


def _set_widths(cells: Sequence[Any], layouts: Sequence[str]) -> None:
    for cell, px in zip(cells, layouts):
        if cell.layout.width != px:
            cell.layout.width = px


def _set_cells(row: RunControls, texts: Sequence[tuple[str, str]], layouts: Sequence[str]
               ) -> None:
    """The row's cells show ``texts`` (``(shown, whole)`` pairs; the whole one is the cell's
    tooltip where it was cut), at the columns' widths; only what changed is sent."""
    w = widgets()
    box = row.cells
    cells = list(box.children)
    if len(cells) != len(texts):
        cells = [w.HTML(layout=w.Layout(flex=_FIXED_SIZE)) for _ in texts]
        box.children = cells
    for cell, (shown, whole), px in zip(cells, texts, layouts):
        title = f' title="{html.escape(whole)}"' if whole != shown else ""
        value = f"<span{title}>{html.escape(shown)}</span>"
        if cell.value != value:
            cell.value = value
        if cell.layout.width != px:
            cell.layout.width = px
    row.texts = [shown for shown, _ in texts]
