"""Plain-text tables for terminals and logs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

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
