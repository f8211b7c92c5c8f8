"""Budget: stop everything after a number of steps or a training wall time."""

from __future__ import annotations

import math

from .base import Context, Decision, Policy


class Budget(Policy):
    """Stops every remaining run (resumably) once the experiment has spent its budget.

    Args:
        max_wall_seconds: training time, over all sessions of the experiment.
        max_total_steps: optimizer steps, summed over every run.
    """

    def __init__(self, max_wall_seconds: float | None = None,
                 max_total_steps: int | None = None) -> None:
        if max_wall_seconds is None and max_total_steps is None:
            raise ValueError("Budget needs max_wall_seconds and/or max_total_steps")
        for name, value in (("max_wall_seconds", max_wall_seconds),
                            ("max_total_steps", max_total_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, (int, float)) or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self.max_wall_seconds, self.max_total_steps = max_wall_seconds, max_total_steps

    def spent(self, context: Context) -> str | None:
        """Why the budget is spent, or ``None``."""
        if self.max_wall_seconds is not None and context.wall_seconds >= self.max_wall_seconds:
            return (f"budget spent: {context.wall_seconds:.0f} s of "
                    f"{self.max_wall_seconds:g} s")
        steps = context.total_steps
        if self.max_total_steps is not None and steps >= self.max_total_steps:
            return f"budget spent: {steps} of {self.max_total_steps} steps"
        return None

    def evaluates_at(self, run: str, chunks: int, chunks_total: int) -> bool:
        return False  # steps and wall time: no metric is read

    def admits_new_runs(self, context: Context) -> bool:
        return self.spent(context) is None

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        reason = self.spent(context)
        if reason is None:
            return []
        return [Decision(h.name, "stop", reason) for h in context.runs.values()
                if h.status.schedulable and h.chunks_done < h.chunks_total]
