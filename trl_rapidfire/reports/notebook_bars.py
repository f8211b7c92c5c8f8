"""The finished preprocessing bars above the notebook panel, collapsed.

Building each run's trainer, TRL maps its datasets (adding EOS, tokenizing, truncating, ...)
and transformers loads the weights, each with a tqdm bar; in a notebook every one stays in the
cell as a widget once finished: nine of them push the panel down the cell. The panel hides the
finished ones (``layout.display = "none"``: nothing is removed) and offers a button to show
them again. A bar is one of these by its tqdm widget class and its label; a bar still running,
or ended in error (tqdm's ``danger`` style), stays in sight, as does every other output.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["finished_preprocessing_bars", "show_bars"]

# What the bars of TRL's dataset preparation, datasets' map/filter and transformers' loading
# are labelled (tqdm writes "<label>: 100%" into the label's widget).
_PREPROCESSING = re.compile(
    r"\b(train|eval|test) dataset\b|^(Map|Filter)\b|^Loading (weights|checkpoint shards)\b"
    r"|^Generating \w{1,40} split\b", re.IGNORECASE)
_LABEL_CHARS = 300


def _label(widget: Any) -> str:
    text = str(getattr(widget, "value", ""))[:_LABEL_CHARS]
    # tqdm writes figure spaces (U+2007) for spaces, so that its numbers keep their width.
    return " ".join(re.sub(r"<[^>]{0,200}>", "", text).split())


def finished_preprocessing_bars() -> list[Any]:
    """The tqdm bars of this kernel that finished (tqdm's ``success`` style) and are labelled
    as a preprocessing or loading step, oldest first."""
    try:
        from ipywidgets.widgets.widget import _instances  # every live widget, by model id
    except ImportError:  # another ipywidgets: nothing found, nothing hidden
        return []
    found = []
    for widget in list(_instances.values()):
        if type(widget).__name__ != "TqdmHBox":
            continue
        children = tuple(getattr(widget, "children", ()))
        if len(children) != 3 or getattr(children[1], "bar_style", "") != "success":
            continue
        if _PREPROCESSING.search(_label(children[0])):
            found.append(widget)
    return found


def show_bars(bars: list[Any], shown: bool) -> None:
    """Show or hide ``bars`` (nothing is sent for a bar already so); a bar shown again gets
    the display tqdm gave it back."""
    for bar in bars:
        layout = getattr(bar, "layout", None)
        if layout is None:
            continue
        if not shown and layout.display != "none":
            bar.rapidfire_display = layout.display
            layout.display = "none"
        elif shown and layout.display == "none":
            layout.display = getattr(bar, "rapidfire_display", None)
