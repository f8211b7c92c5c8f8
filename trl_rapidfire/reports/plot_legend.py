"""The run legend of the report's figures: each run named with only the knobs that tell it
apart from the other runs drawn, in a short form, wrapped to a few lines, and a figure grown
until its legends fit beside the axes.

A knob that every run shares tells no run apart, so it is left out of the legend (the summary
table lists all of them). A label is not cut at the figure's edge or a fixed width: a long
one wraps onto more lines and the figure grows to hold it, so what makes a run different
always shows (only a single value too long to read at a glance is shortened).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from .display import differing_keys
from .experiment_data import RunData

__all__ = ["differing_knobs", "fit_legends", "legend_style", "run_labels", "short_values"]

# A LoRA config as the shared state keeps it (see knobs.describe_value).
_LORA = re.compile(
    r"LoraConfig\(r=(?P<r>[^,]+), alpha=(?P<alpha>[^,]+), targets=(?P<targets>.*)\)")
_MISSING = object()
# Longest a value's text may get; past that it is shortened with an ellipsis (a long string
# knob, a function's qualified name) so one knob cannot make the legend as wide as the figure.
_VALUE_CHARS = 22
# Legend entries in one column before a second one is started, and before the font shrinks.
_LINES_PER_COLUMN = 24


def differing_knobs(runs: Sequence[RunData]) -> list[str]:
    """The knob names whose values are not the same in all ``runs``
    (:func:`~.display.differing_keys`, the one rule of the tables and the panels)."""
    return differing_keys([run.knobs for run in runs])


def _ellipsize(text: str, limit: int = _VALUE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"


def _scientific(value: float) -> str:
    mantissa, _, exponent = f"{value:.2e}".partition("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent}"


def _needs_exponent(value: float) -> bool:
    size = abs(value)
    return size != 0 and math.isfinite(size) and (size < 1e-2 or size >= 1e5)


def _plain(value: Any) -> str:
    if isinstance(value, str):
        return _ellipsize(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (bool, int)) or value is None:
        return str(value)
    return _ellipsize(json.dumps(value, default=repr, separators=(",", ":")))


def _targets(text: str) -> str:
    # "['q_proj', 'v_proj']" -> "q_proj,v_proj"; "'all-linear'" -> "all-linear".
    return _ellipsize(",".join(part.strip(" '\"") for part in text.strip("[]").split(",")))


def short_values(values: Sequence[Any]) -> tuple[list[str], bool]:
    """The values of one knob across the runs, each in a short form, and whether the form
    names itself (a LoRA config: ``LoRA r=8``), so the knob's name need not precede it.

    Floats are in exponent form (``3e-03``) for the whole knob when any of them is very small
    or large, else to 4 significant digits, so a column of learning rates reads alike.
    A LoRA config shows its rank, and its alpha and target modules only where these differ
    between the runs. A run without the knob (``run_labels`` passes a marker for it) shows
    ``-``.
    """
    present = [v for v in values if v is not _MISSING]
    loras = [_LORA.fullmatch(v) if isinstance(v, str) else None for v in present]
    if present and all(loras):
        shown = [f for f in ("alpha", "targets")
                 if len({m.group(f) for m in loras if m is not None}) > 1]
        out = []
        for value in values:
            match = _LORA.fullmatch(value) if isinstance(value, str) else None
            if match is None:
                out.append("LoRA -")
                continue
            text = f"LoRA r={match.group('r')}"
            if "alpha" in shown:
                text += f" alpha={match.group('alpha')}"
            if "targets" in shown:
                text += f" {_targets(match.group('targets'))}"
            out.append(text)
        return out, True
    floats = [v for v in present if isinstance(v, float)]
    exponent = any(_needs_exponent(v) for v in floats)
    return [("-" if v is _MISSING
             else _scientific(v) if exponent and isinstance(v, float) and math.isfinite(v)
             else _plain(v)) for v in values], False


def _wrap(tokens: Sequence[str], width: int) -> str:
    # Greedy, never breaking inside a token: a knob's name and value stay on one line.
    lines = [tokens[0]]
    for token in tokens[1:]:
        if len(lines[-1]) + 2 + len(token) <= width:
            lines[-1] += "  " + token
        else:
            lines.append("  " + token)
    return "\n".join(lines)


def run_labels(runs: Sequence[RunData], width: int = 38) -> dict[str, str]:
    """Run name -> its legend label: the name and the knobs that differ between ``runs``
    (``learning_rate=3e-03``), wrapped onto lines of about ``width`` characters."""
    keys = differing_knobs(runs)
    columns = {}
    for key in keys:
        texts, self_named = short_values([run.knobs.get(key, _MISSING) for run in runs])
        columns[key] = texts if self_named else [f"{key}={t}" for t in texts]
    return {run.name: _wrap([run.name, *(columns[k][i] for k in keys)], width)
            for i, run in enumerate(runs)}


def legend_style(labels: Sequence[str]) -> dict[str, Any]:
    """``fig.legend`` keywords for the run legend: one column of ``small`` text while the
    labels' lines fit, then two columns, then ``x-small`` text."""
    lines = sum(label.count("\n") + 1 for label in labels)
    ncols = 1 if lines <= _LINES_PER_COLUMN else 2
    fontsize = "small" if lines <= ncols * _LINES_PER_COLUMN else "x-small"
    return {"ncols": ncols, "fontsize": fontsize}


def fit_legends(fig: Any, legends: Sequence[Any], axes_width: float, min_height: float,
                title: Any = None, gap: float = 0.35) -> None:
    """Resize ``fig`` so that ``legends``, stacked beside the axes (``outside right``), fit
    in it: as tall as the legends one above the other plus ``gap`` inches each (at least
    ``min_height``), and ``axes_width`` inches for the axes plus the widest legend. The
    ``title`` (the figure's suptitle) is centred over the axes rather than the whole figure,
    so that it does not run into the legends at the top right.

    The legends are measured after a layout pass, so the size is the text's true extent at
    the figure's dpi, not an estimate from the number of characters.
    """
    legends = [lg for lg in legends if lg is not None]
    if not legends:
        return
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    boxes = [lg.get_window_extent(renderer) for lg in legends]
    tall = sum(b.height for b in boxes) / fig.dpi + gap * (len(boxes) + 1)
    wide = max(b.width for b in boxes) / fig.dpi + 0.3
    fig.set_size_inches(axes_width + wide, max(min_height, tall))
    if title is not None:
        title.set_x(axes_width / 2 / (axes_width + wide))
