"""What a person watching the terminal sees: one progress bar for the whole experiment and, at
each chunk boundary, a compact table of the runs."""

from __future__ import annotations

from collections.abc import Sequence

from .report import results_table
from .results import RunResult

__all__ = ["ExperimentProgress", "runs_table"]


def runs_table(runs: Sequence[RunResult]) -> str:
    """``run  status  steps  loss  eval_loss  knobs`` for every run."""
    return results_table(runs, {"loss": "loss", "eval_loss": "eval_loss"})


class ExperimentProgress:
    """A tqdm bar over every chunk of every run, and the runs table at each boundary.

    Disabled (prints nothing) when ``enabled`` is false, e.g. ``disable_tqdm=True``.
    """

    def __init__(self, total_chunks: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar = None
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
        if self._bar is not None:
            self.set_done(done)
            self._bar.write(runs_table(runs))

    def set_done(self, done: int) -> None:
        if self._bar is not None:
            self._bar.n = done
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
