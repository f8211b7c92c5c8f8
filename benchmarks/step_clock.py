"""A clock around a trainer's optimizer steps, shared by the benchmarks that compare the time
inside steps (``kinds_steps.py``, ``real_shape.py``).

Its two callbacks go at the two ends of a trainer's callback list: ``End`` first, so a step's
time stops before any other callback's ``on_step_end`` work; ``Begin`` last, so it starts after
every other ``on_step_begin`` has run. The last matters for an RF run: its chunk callback ends
the run's turn inside ``on_step_begin`` at a chunk boundary (other runs train meanwhile), so a
clock started before it counted every other run's turns as this run's step. An RF run's own
trainer is ``RFTrainer.run_trainer(name)``; the RF trainer's ``add_callback`` gives each run a
copy placed before the chunk callback, which is why that is not used here.
"""

from __future__ import annotations

import time
from typing import Any


class StepClock:
    """Seconds inside ``trainer``'s steps (``seconds``), their count (``steps``) and the wall
    time (``time.time()``) at which each ``global_step`` ended (``ends``)."""

    def __init__(self, trainer: Any) -> None:
        from transformers import TrainerCallback

        clock = self

        class Begin(TrainerCallback):  # reads the clock only: no RNG, no state
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock.began = time.perf_counter()

        class End(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock.seconds += time.perf_counter() - clock.began
                clock.steps += 1
                clock.ends[state.global_step] = time.time()

        self.began, self.seconds, self.steps = 0.0, 0.0, 0
        self.ends: dict[int, float] = {}
        callbacks = trainer.callback_handler.callbacks
        callbacks.append(Begin())
        callbacks.insert(0, End())


def clock_rf_runs(trainer: Any) -> list[StepClock]:
    """A :class:`StepClock` on each run of an RF trainer, built before ``train()`` (each run's
    trainer is built then; its chunk callback is already in its list)."""
    return [StepClock(trainer.run_trainer(run.name)) for run in trainer.runs]
