"""What a person watching sees: one progress bar for the whole experiment and, at each chunk
boundary, a compact table of the runs: printed below the bar in a terminal, refreshed in place
in a Jupyter notebook."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

from .report import results_table
from .results import RunResult

__all__ = ["ExperimentProgress", "runs_table"]


def runs_table(runs: Sequence[RunResult]) -> str:
    """``run  status  steps  loss  eval_loss  knobs`` for every run."""
    return results_table(runs, {"loss": "loss", "eval_loss": "eval_loss"})


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
    """A tqdm bar over every chunk of every run, and the runs table at each boundary.

    In a Jupyter kernel the table is one output, updated in place at every boundary (by its
    display id, so it updates even while ``train(blocking=False)`` runs and other cells
    execute); elsewhere it is printed below the bar. Disabled (shows nothing) when ``enabled``
    is false, e.g. ``disable_tqdm=True``.
    """

    def __init__(self, total_chunks: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar = None
        self._display = notebook_display() if enabled else None
        self._table: Any = None  # the notebook output the table lives in
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_chunks, desc="chunks", unit="chunk", dynamic_ncols=True)

    @property
    def showing(self) -> bool:
        """Whether anything is shown (callers skip building what would not be)."""
        return self._bar is not None

    def set_total(self, total_chunks: int) -> None:
        if self._bar is not None:
            self._bar.total = total_chunks
            self._bar.refresh()

    def start(self, run: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(run)

    def chunk_done(self, runs: Sequence[RunResult], done: int) -> None:
        """A chunk ended; ``done`` chunks of the experiment are finished (by any worker, in
        any session)."""
        if self._bar is None:
            return
        self.set_done(done)
        text = runs_table(runs)
        if self._display is None:
            self._bar.write(text)
            return
        data = {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}
        if self._table is None:
            self._table = self._display(data, raw=True, display_id=True)
        else:
            self._table.update(data, raw=True)

    def set_done(self, done: int) -> None:
        if self._bar is not None:
            self._bar.n = done
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
