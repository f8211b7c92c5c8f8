"""The parts of the notebook panel (:mod:`.notebook_panel`) that steer: what the panel needs
of a trainer (:class:`PanelTrainer`), the clone form, and how an op a button queued finds its
answer in the op log.

Kept apart from the panel's drawing and polling so each stays one concern; the form is tested
on its own against a fake trainer (it only parses fields and calls ``clone``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..control.ops import OP_DEPTH, OpRecord
from ..search.object_knobs import is_config_object
from ..shared_state.runs import RunStatus
from ..storage.outside_text import OP_TEXT_BYTES, NotJSON, loads
from .display import differing_keys
from .knob_fields import config_fields, expand_knobs
from .report import format_value
from .results import RunResult

__all__ = ["INSTALL_HINT", "WARM_START", "AskedOp", "CloneForm", "PanelTrainer", "answer_of",
           "differing_knobs", "error_html", "knob_value", "muted_html", "parse_field",
           "widgets"]

# What works wherever the package came from (the extra needs a clone: pip install -e ".[notebook]").
INSTALL_HINT = 'pip install ipywidgets'
# The knob every person tunes first: always offered in the clone form.
_ALWAYS_OFFERED = ("learning_rate",)
# The fields of a config object knob offered one by one even where the runs share them: a
# LoRA config's rank, alpha, dropout and targets (other fields: "more").
_OFFERED_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules")
_FIELDS_HINT = (
    "Each field is a knob, or one field of a config object (<code>peft_config.lora_alpha"
    "</code>), filled with the run's value. Only the fields you change are sent: JSON "
    "(<code>1e-4</code>, <code>16</code>, <code>[\"q_proj\"]</code>) or plain text "
    "(<code>cosine</code>); other overrides in <i>more</i> as a JSON object.")
# What a warm start keeps and what starts over (engine/clones.py, trainers/run_builder.py's
# _check_warm_start): said next to the checkbox, so nobody has to guess.
WARM_START = (
    "<b>Warm start</b> keeps the parent's trained weights (its LoRA adapter, or the whole "
    "model without one) and its optimizer moments, as of its last finished chunk; the clone's "
    "step count, learning-rate schedule (warm-up included) and data order start over from "
    "step 0. It cannot change the adapter's shape (<code>r</code>, <code>target_modules"
    "</code>, ...), the base model, or LoRA for full fine-tuning, and needs a parent with a "
    "finished chunk. Unticked, the clone trains from scratch.")


class PanelTrainer(Protocol):
    """What the panel needs of a trainer: an RF trainer's public face, nothing more."""

    @property
    def runs(self) -> Sequence[RunResult]: ...

    @property
    def op_log(self) -> Sequence[OpRecord]: ...

    @property
    def schedule(self) -> Sequence[Any]: ...

    @property
    def training(self) -> bool: ...

    def metric_history(self, run: str, key: str = "loss") -> list[tuple[int, float]]: ...

    def stop(self, run: str) -> None: ...

    def resume(self, run: str) -> None: ...

    def delete(self, run: str) -> None: ...

    def clone(self, run: str, overrides: dict[str, Any] | None = None, *,
              warm: bool = False) -> None: ...


def widgets() -> Any:
    """The ``ipywidgets`` module, imported when a panel is made (the package itself never
    needs it), or an ``ImportError`` that says which extra brings it."""
    try:
        import ipywidgets
    except ImportError:
        raise ImportError(f"the notebook panel needs ipywidgets: {INSTALL_HINT}") from None
    return ipywidgets


def parse_field(text: str, what: str = "the field") -> Any:
    """A form field's value: JSON where it parses (``1e-4`` is the float ``0.0001``, ``16``
    an int, ``true`` a bool), else the text itself (``cosine`` needs no quotes).

    Held to an op's bounds before it is parsed (its length, and a nesting of at most
    ``OP_DEPTH``): ``[[[[...`` a few thousand deep would raise ``RecursionError`` from inside
    the parser.

    Raises:
        ValueError: the text is too long or nests too deeply (the message names ``what``).
    """
    try:
        return loads(text, what=what, max_bytes=OP_TEXT_BYTES, max_depth=OP_DEPTH)
    except NotJSON:
        return text


def _field_text(value: Any) -> str:
    """A knob value as a form field shows it: JSON when it is JSON (so that parsing it back
    gives the same value), else its short description."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return format_value(value)


def differing_knobs(runs: Sequence[RunResult]) -> list[str]:
    """The knobs whose values are not the same in every run
    (:func:`~.display.differing_keys`, the one rule of the tables and the panels), a config
    object by the fields that differ (:func:`~.knob_fields.expand_knobs`:
    ``peft_config.lora_alpha``)."""
    return differing_keys(expand_knobs([run.knobs for run in runs]))


def knob_value(knobs: dict[str, Any], name: str) -> tuple[bool, Any]:
    """``(found, value)`` of the knob ``name`` in a run's ``knobs``: a knob, or a dotted
    field of a config object knob (``peft_config.r``)."""
    if name in knobs:
        return True, knobs[name]
    head, dot, attr = name.partition(".")
    fields = config_fields(knobs[head]) if dot and head in knobs else None
    if fields is not None and attr in fields:
        return True, fields[attr]
    return False, None


@dataclass
class AskedOp:
    """An op a button queued: its verb, and how long the op log was just before (its
    answer is the first record on the run from Python after that)."""

    verb: str
    log_from: int


def answer_of(asked: AskedOp, run: str, log: Sequence[OpRecord]) -> OpRecord | None:
    """The op log's answer to ``asked`` on ``run`` (for a clone, ``run`` is the parent),
    ``None`` while it is queued. Ops from tags or a policy on the same run are not it."""
    for record in log[asked.log_from:]:
        if (record.run == run and record.source == "python"
                and record.op.split(" ", 1)[0] == asked.verb):
            return record
    return None


class CloneForm:
    """Clone a run: the run to clone from, a field for each knob that differs between runs
    (and ``learning_rate``), a config object knob field by field (``peft_config.r``,
    ``peft_config.lora_alpha``, ...: the fields that differ, and a LoRA config's rank, alpha,
    dropout and targets), each pre-filled with that run's value, a field for more overrides
    as a JSON object, warm start (with what it keeps and what starts over), and a button.
    Only the fields a person changed are sent (a dotted field as a dotted override): an
    unchanged value is the parent's anyway."""

    def __init__(self, trainer: PanelTrainer,
                 on_asked: Callable[[str, AskedOp], None] | None = None) -> None:
        w = widgets()
        self._trainer = trainer
        self._on_asked = on_asked
        self._filled: dict[str, str] = {}
        self._runs: dict[str, RunResult] = {}
        self._knobs: list[str] = []
        self.fields: dict[str, Any] = {}
        """The knob fields (``ipywidgets.Text``) of the run chosen, by knob name."""
        self.source = w.Dropdown(description="clone from", options=[])
        self.more = w.Text(description="more", placeholder='{"peft_config.r": 16}')
        self.warm = w.Checkbox(description="warm start", value=False)
        self.button = w.Button(description="Clone", button_style="info",
                               tooltip="queue a clone; it is added at the next chunk boundary")
        self.answer = w.HTML()
        self._box = w.VBox()
        self.hint = w.HTML(f'<span style="color:#666">{_FIELDS_HINT}</span>')
        self.warm_hint = w.HTML(f'<span style="color:#666">{WARM_START}</span>',
                                layout=w.Layout(max_width="760px"))
        self.widget = w.VBox([w.HTML("<b>Clone a run</b>"), self.source, self.hint, self._box,
                              self.more, w.HBox([self.warm, self.button]), self.warm_hint,
                              self.answer])
        self._quiet = False
        self.source.observe(self._chosen, names="value")
        self.button.on_click(lambda _button: self.submit())

    def _chosen(self, change: dict[str, Any]) -> None:
        if not self._quiet:
            self.fill(change["new"])

    def set_runs(self, runs: Sequence[RunResult]) -> None:
        """The runs one may clone from (deleted ones cannot be); keeps the choice made."""
        self._runs = {r.name: r for r in runs}
        self._knobs = differing_knobs(runs)
        names = [r.name for r in runs if r.status != RunStatus.DELETED]
        if list(self.source.options) == names:
            return
        chosen = self.source.value
        # New options move the choice (to the first run, or none) before it can be set back;
        # the fields a person may be typing in are filled again only if the choice moved.
        self._quiet = True
        try:
            self.source.options = names
            if names:
                self.source.value = chosen if chosen in names else names[0]
        finally:
            self._quiet = False
        if self.source.value != chosen:
            self.fill(self.source.value)

    def fill(self, run: str | None) -> None:
        """Pre-fill the fields with ``run``'s current knob values."""
        w = widgets()
        result = self._runs.get(run) if run else None
        if result is None:
            return
        objects = [f"{head}.{attr}" for head, value in result.knobs.items()
                   if is_config_object(value)
                   for attr in (config_fields(value) or {}) if attr in _OFFERED_FIELDS]
        # A clone sets fields of a config object only (a dict knob is sent whole).
        knobs = [n if is_config_object(result.knobs.get(n.partition(".")[0])) or n in
                 result.knobs else n.partition(".")[0] for n in self._knobs]
        names = list(dict.fromkeys([*knobs, *_ALWAYS_OFFERED, *objects]))
        # A config object offered field by field is no field of its own (its whole text could
        # not be sent back).
        names = [n for n in names if not any(m.startswith(f"{n}.") for m in names)]
        self._filled = {}
        for name in names:
            found, value = knob_value(result.knobs, name)
            self._filled[name] = _field_text(value) if found else ""
        self.fields = {n: w.Text(description=n, value=text,
                                 placeholder="" if text else "unchanged",
                                 style={"description_width": "initial"})
                       for n, text in self._filled.items()}
        self._box.children = list(self.fields.values())

    def overrides(self) -> dict[str, Any]:
        """The overrides the form holds: each changed field, parsed, then the "more" object.

        Raises:
            ValueError: "more" is not a JSON object, or a field is too long or too deep.
        """
        out = {name: parse_field(field.value.strip(), f"the field {name!r}")
               for name, field in self.fields.items()
               if field.value.strip() and field.value.strip() != self._filled.get(name)}
        more = self.more.value.strip()
        if more:
            extra = parse_field(more, 'the field "more"')
            if not isinstance(extra, dict):
                raise ValueError(f'"more" must be a JSON object, got {more!r}')
            out.update(extra)
        return out

    def submit(self) -> None:
        """Queue the clone (the button's action); errors show in the form's answer line."""
        run = self.source.value
        if not run:
            self.answer.value = muted_html("no run to clone from")
            return
        try:
            overrides = self.overrides()
            log_from = len(self._trainer.op_log)
            self._trainer.clone(run, overrides, warm=bool(self.warm.value))
        except Exception as err:  # noqa: BLE001 - shown to the person who clicked
            self.answer.value = error_html(f"clone: {err}")
            return
        verb = "clone-warm" if self.warm.value else "clone"
        shown = json.dumps(overrides)
        self.answer.value = muted_html(f"{verb} {html.escape(shown)} of {html.escape(run)}: "
                                       "queued, its answer shows in the run's line")
        if self._on_asked is not None:
            self._on_asked(run, AskedOp(verb, log_from))


def muted_html(text: str) -> str:
    """``text`` (HTML already) in grey: a state that will change (an op queued)."""
    return f'<span style="color:#666">{text}</span>'


def error_html(text: str) -> str:
    """``text`` (plain, escaped here) in red: an op refused, or a click that failed."""
    return f'<span style="color:#b00">{html.escape(text)}</span>'
