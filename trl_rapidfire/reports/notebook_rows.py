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

Every row is one line, its buttons beside its cells, and the table never scrolls sideways: where
the output is narrower than the row (1280 px with JupyterLab's file browser open), the knob and
last-op columns give way (the same in every row and the header, so the columns stay lined up),
each text cut with an ellipsis and whole in its tooltip, as the answer to a button's op is. The
rows scroll inside a box of their own under a header that stays in sight. The buttons' own ways
(pressed while pending, Delete confirmed) are :mod:`.notebook_buttons`'.
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
from .notebook_buttons import DeleteConfirmation, ask_button
from .notebook_form import widgets
from .report import format_value
from .results import RunResult

__all__ = ["KNOB_CHARS", "MAX_KNOB_COLUMNS", "TABLE_CSS", "RunControls", "RunsTable",
           "table_columns"]

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
_PAD_PX = 10
_FILTER_CHARS = 200  # the browser panel's bound on the filter text
# Cells and buttons keep their width (the run, its status and numbers); the knob columns give
# way where the row is wider than the output, and the last op's; an answer takes what is left
# (its text cut, whole in its tooltip). A column gives way by its header's room over its
# values first (its flex-shrink, see _give), so a value is cut only once the headers are.
_FIXED_SIZE = "0 0 auto"
_LEAST_PX = "24px"
_GIVE_ANYWAY, _GIVE_LAST_OP = 0.1, 0.5
_VERBS = ("stop", "resume", "delete", "clone")
# Each button's width, and the margin on each side (set here, not left to the theme, so the
# header's place for them is exactly theirs): "Confirm" fits Delete's.
_BUTTON_PX = {"stop": 44, "resume": 62, "delete": 62, "clone": 50}
_BUTTON_MARGIN_PX = 2
_BUTTONS_PX = sum(_BUTTON_PX.values()) + 2 * _BUTTON_MARGIN_PX * len(_BUTTON_PX)
_ANSWER = {"flex": "1 1 0", "min_width": "64px"}
_ROWS_HEIGHT = "560px"  # about 20 rows, then they scroll in their box
# What ipywidgets' layouts cannot say: a cell is one line cut with an ellipsis, the header
# stays at the top of the rows' box, the buttons are compact, and an answer's tooltip shows
# (ipywidgets puts an HTML widget's tooltip on its label, hidden when it has no description:
# here the label lies, unseen, over the answer). Scoped by the panel's classes.
TABLE_CSS = """<style>
.rf-cell, .rf-answer { min-width: 0; overflow: hidden; }
.rf-cell > .widget-html-content, .rf-answer > .widget-html-content {
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; min-width: 0; }
.rf-row, .rf-head { flex-wrap: nowrap; overflow: hidden; flex-shrink: 0; }
.rf-head { position: sticky; top: 0; z-index: 1; background: var(--jp-layout-color0, #fff); }
.rf-answer { position: relative; }
.rf-answer > .widget-label { display: block !important; position: absolute; inset: 0;
  width: auto; margin: 0; opacity: 0; z-index: 1; }
.rf-row .jupyter-button { padding: 0 4px; }
</style>"""


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

    def button(self, verb: str) -> Any:
        """The button that asks ``verb`` (``stop``, ``resume``, ``delete``), else ``None``
        (a clone is asked in the form)."""
        return getattr(self, verb) if verb in ("stop", "resume", "delete") else None


def filter_word_matches(word: str, name: str, pairs: Sequence[tuple[str, str]]) -> bool:
    """Whether one word of the filter text lets a run through (all lower case): ``key=value``
    matches a knob named ``key`` (or ending in ``.key``: ``r=16`` is ``peft_config.r``) whose
    value is ``value``, numbers compared as numbers (``learning_rate=0.001`` is ``1e-3``, not
    ``0.00102``); any other word is looked for in the run's name and its ``key=value`` texts.
    The browser panel's filter follows the same rule (panel_table.js)."""
    key, eq, want = word.partition("=")
    if not (eq and key and want):
        return word in name or any(word in f"{k}={v}" for k, v in pairs)
    return any((k == key or k.endswith(f".{key}")) and _same_value(v, want) for k, v in pairs)


def _same_value(have: str, want: str) -> bool:
    if have == want:
        return True
    try:
        return float(have) == float(want)
    except ValueError:
        return False


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
        self._order: list[str] = []  # the rows' order in the table, as last drawn
        """The runs the filters let through, in the table's order."""
        self._runs: list[RunResult] = []
        self._training = False
        # run -> its name and (knob, value) pairs, lower case: what the filter words match
        self._search: dict[str, tuple[str, list[tuple[str, str]]]] = {}
        self.confirm = DeleteConfirmation()
        """Which runs' Delete asks to be confirmed (see :mod:`.notebook_buttons`)."""
        # One layout and one style for each kind of part, shared by every row (each is a
        # model the front end is sent): showing 128 runs sent some 12,000 messages, past the
        # rate at which Jupyter's server drops them (the panel then never drew). A column's
        # cells share its layout, so a new width is one message.
        self._columns: list[Any] = []
        self._styles = {kind: _shared_style(kind) for kind in (w.HTML, w.Button, w.ToggleButton)}
        self._layouts = {verb: w.Layout(width=f"{_BUTTON_PX[verb]}px", flex=_FIXED_SIZE,
                                        margin=f"0 {_BUTTON_MARGIN_PX}px") for verb in _VERBS}
        self._layouts["answer"] = w.Layout(**_ANSWER)
        self._layouts["cells"] = w.Layout(flex="0 1 auto", min_width="0")
        # The header is laid out as a row is (its cells in a box, the buttons' width, the
        # answer's), so that the columns give way alike and stay lined up.
        self._header = w.HBox(layout=self._layouts["cells"])
        ops = w.HTML("<b>ops</b>", layout=w.Layout(width=f"{_BUTTONS_PX}px", margin="0",
                                                   flex=_FIXED_SIZE))
        head = w.HBox([self._header, ops, w.HTML(layout=self._layouts["answer"])],
                      _dom_classes=("rf-head",))
        self._head = head
        self._body = w.VBox([head], layout=w.Layout(max_height=_ROWS_HEIGHT, overflow="auto"))
        self.filter = w.Text(placeholder="filter: words in a run's name or knob values",
                             layout=w.Layout(width="260px"))
        self.statuses: dict[str, Any] = {}
        """A checkbox per status the runs have: unticked, its runs are hidden."""
        self._status_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self.count = w.HTML()
        self.filter.observe(lambda _change: self._filtered(), names="value")
        style = w.HTML(TABLE_CSS, layout=w.Layout(display="none"))
        self.widget = w.VBox([style, w.HBox([self.filter, self._status_box, self.count],
                                            layout=w.Layout(flex_flow="row wrap")),
                              self._body])

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
            self._search[run.name] = (run.name.lower(), [
                (k.lower(), format_value(v).lower()) for k, v in values.items()])
        labels = [_label(h) for h in headers]
        fixed = len(_FIXED) + len(kind)
        longest = [max([0, *(len(row[i][0]) for row in texts.values())])
                   for i in range(len(headers))]
        layouts = [(f"{_px(max(len(label), n))}px",
                    _FIXED_SIZE if i < fixed else _give(len(label), n, i == len(headers) - 1))
                   for i, (label, n) in enumerate(zip(labels, longest))]
        stale: list[Any] = []  # the last columns' header cells and layouts, closed once unused
        if headers != self.headers:
            self.headers = headers
            stale = [*self._header.children, *self._columns]
            self._columns = [w.Layout(width=px, flex=flex, margin="0 1px",
                                      min_width=None if flex == _FIXED_SIZE else _LEAST_PX)
                             for px, flex in layouts]
            self._header.children = [self._cell(i, f'<b title="{html.escape(h)}">'
                                                f"{html.escape(label)}</b>")
                                     for i, (h, label) in enumerate(zip(headers, labels))]
        for column, (px, flex) in zip(self._columns, layouts):
            with column.hold_sync():
                column.width, column.flex = px, flex
                column.min_width = None if flex == _FIXED_SIZE else _LEAST_PX
        added = False
        for run in runs:
            row = self.rows.get(run.name)
            if row is None:
                row = self.rows[run.name] = self._new_row(run.name)
                added = True
            self._set_cells(row, texts[run.name])
            row.stop.disabled = run.status not in _STOPPABLE
            row.resume.disabled = run.status != RunStatus.STOPPED
            row.delete.disabled = row.clone.disabled = run.status == RunStatus.DELETED
        order = [run.name for run in runs]  # best first, as the panel ranks them
        if added or order != self._order:
            self._order = order
            self._body.children = [self._head, *(self.rows[n].widget for n in order),
                                   *(r.widget for n, r in self.rows.items() if n not in order)]
        _close(*stale)
        for name in self.confirm.expire({n: row.delete for n, row in self.rows.items()}):
            self.rows[name].answer.value = self.rows[name].answer.tooltip = ""
        self._draw_status_filters(
            {shown_status(run.status, training=training) for run in runs})
        self._apply_filters()

    def _new_row(self, run: str) -> RunControls:
        w = widgets()
        buttons = {verb: (w.Button if verb == "clone" else ask_button)(
            description=verb.capitalize(), tooltip=f"{verb} {run}",
            layout=self._layouts[verb],
            style=self._styles[w.Button if verb == "clone" else w.ToggleButton])
            for verb in _VERBS}
        for verb in ("stop", "resume"):
            buttons[verb].on_click(lambda _b, v=verb: self._asked(run, v))
        buttons["delete"].on_click(lambda b: self._delete_pressed(run, b))
        buttons["clone"].on_click(lambda _b: self._asked(run, "clone"))
        # One line: what does not fit is cut (whole in the tooltip the panel sets).
        answer = w.HTML(layout=self._layouts["answer"], style=self._styles[w.HTML],
                        _dom_classes=("rf-answer",))
        cells = w.HBox(layout=self._layouts["cells"])
        # Its own layout: the filters hide a row by it.
        widget = w.HBox([cells, *buttons.values(), answer], _dom_classes=("rf-row",),
                        layout=w.Layout(align_items="center", flex_flow="row nowrap"))
        return RunControls(answer=answer, widget=widget, cells=cells, **buttons)

    def _cell(self, column: int, value: str = "") -> Any:
        """A cell of ``column`` (its layout the column's)."""
        w = widgets()
        return w.HTML(value, layout=self._columns[column], style=self._styles[w.HTML],
                      _dom_classes=("rf-cell",))

    def _set_cells(self, row: RunControls, texts: Sequence[tuple[str, str]]) -> None:
        """The row's cells show ``texts`` (``(shown, whole)`` pairs; the whole one is the
        cell's tooltip, for a text cut here or by a column giving way), in the columns'
        layouts; only what changed is sent."""
        cells = list(row.cells.children)
        if len(cells) != len(texts) or (cells and cells[0].layout is not self._columns[0]):
            _close(*cells)
            cells = [self._cell(i, _cell_html(*text)) for i, text in enumerate(texts)]
            row.cells.children = cells
        for cell, text in zip(cells, texts):
            value = _cell_html(*text)
            if cell.value != value:
                cell.value = value
        row.texts = [shown for shown, _ in texts]

    def _asked(self, run: str, verb: str) -> None:
        """A row's Stop, Resume or Clone: a Delete waiting for its confirmation stops
        waiting, and the op is asked."""
        row = self.rows.get(run)
        if row is not None:
            self.confirm.disarm(run, row.delete)
        if verb == "clone":
            self._on_clone(run)
        else:
            self._on_op(run, verb)

    def _delete_pressed(self, run: str, button: Any) -> None:
        """Delete: the first press asks to be confirmed (the row's answer says so), a press
        on Confirm deletes."""
        if self.confirm.press(run, button):
            self._on_op(run, "delete")
        elif self.confirm.armed(run) and run in self.rows:
            text = f"delete: click Confirm to delete {run} for good (its state is freed)"
            answer = self.rows[run].answer
            answer.value, answer.tooltip = f"<b>{html.escape(text)}</b>", text

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
        name, pairs = self._search.get(run.name, (run.name.lower(), []))
        return all(filter_word_matches(word, name, pairs) for word in words)

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


def _label(header: str) -> str:
    """A column's header as shown: a config object's field by its own name (``lora_alpha``
    for ``peft_config.lora_alpha``: the whole name is its tooltip), so that a column of short
    values stays narrow."""
    return header.partition(".")[2] or header


def _px(chars: int) -> int:
    return round(chars * _CHAR_PX + _PAD_PX)


def _give(label: int, values: int, last_op: bool) -> str:
    """How a column gives way (its CSS ``flex``), its header ``label`` and its longest value
    ``values`` characters wide. A column shrinks by its flex-shrink times its width: that
    product here is the header's room over the values (what can go without cutting a value),
    plus a little of the width (the last op's, less useful, more) for when no header room is
    left."""
    width = _px(max(label, values))
    room = max(label - values, 0) * _CHAR_PX
    anyway = _GIVE_LAST_OP if last_op else _GIVE_ANYWAY
    return f"0 {room / width + anyway:.3g} auto"


def _cell_html(shown: str, whole: str) -> str:
    title = f' title="{html.escape(whole)}"' if whole else ""
    return f"<span{title}>{html.escape(shown)}</span>"


def _close(*widgets: Any) -> None:
    """Close widgets replaced (the kernel and the front end forget them)."""
    for widget in widgets:
        widget.close()


def _shared_style(kind: Any) -> Any:
    """A new style of the kind a ``kind`` widget takes (ipywidgets names some style classes
    only through the widget's trait)."""
    return kind.class_traits()["style"].klass()
