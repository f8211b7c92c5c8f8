"""Plain-text tables for terminals and logs, and which knobs a table of runs shows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

ELLIPSIS = "…"


def clip(text: str, width: int, *, keep: Literal["ends", "head"] = "ends") -> str:
    """``text`` cut to at most ``width`` characters, an ellipsis marking the cut: in the
    middle (``keep="ends"``: the start and the end of a value tell values apart) or at the
    end (``keep="head"``)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    if keep == "head":
        return text[:width - 1] + ELLIPSIS
    head = width // 2
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A left-aligned text table with a header rule; every cell is ``str()``-ed."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


_MISSING = "\0missing"  # a run without the key: a value of its own


def differing_keys(rows: Sequence[Mapping[str, Any]],
                   own_names: Sequence[str] | None = None) -> list[str]:
    """The knobs a table (or legend) of runs shows: the keys whose values are not the same in
    every row, in the order they first appear. What all runs share tells none of them apart,
    and a run that lacks a key differs in it. Values compare as JSON (equal text, equal value;
    what is not JSON by its ``repr``).

    With ``own_names`` (each row's run name), a key whose value holds that row's own name is
    left out: in a run's whole config (its MLflow params) ``output_dir`` or ``run_name``
    differ in every run but tune nothing. This is the one rule of "the knobs that differ" for
    the CLI's status, the dashboard's columns, the report's legends and the notebook panel
    (the browser panel's page follows it too: ``panel.js``'s ``knobColumns``)."""
    found = []
    for key in dict.fromkeys(k for row in rows for k in row):
        values = [json.dumps(row[key], sort_keys=True, default=repr) if key in row else _MISSING
                  for row in rows]
        if len(set(values)) < 2:
            continue
        if own_names is not None and any(
                name and key in row and name in str(row[key])
                for name, row in zip(own_names, rows)):
            continue
        found.append(key)
    return found
