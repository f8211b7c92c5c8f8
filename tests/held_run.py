"""A callback that holds one run inside a chunk while a test steers it as a person would (a
tag set in MLflow's UI, a button in a panel), so the op lands mid-chunk however fast the
machine is."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from typing import Any

from transformers import TrainerCallback


class HeldRun(TrainerCallback):
    """Holds the run trained at ``learning_rate`` at the end of step ``step`` (``reached`` is
    set) until the test sets ``release``, then until the experiment's tracking thread (it
    polls the control tags about once a second) has seen an op for each of ``awaited``.

    Every run's trainer gets a deep copy of the callbacks: this one is shared instead. Set
    :attr:`trainer` to the RF trainer before training. ``timed_out`` says the test never
    released it (the run then trains on, and the test's own checks fail)."""

    def __init__(self, learning_rate: float, step: int, awaited: Collection[str]) -> None:
        self.learning_rate, self.step, self.awaited = learning_rate, step, set(awaited)
        self.reached, self.release = threading.Event(), threading.Event()
        self.trainer: Any = None
        self.timed_out = False

    def __deepcopy__(self, memo):
        return self

    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate != self.learning_rate or state.global_step != self.step:
            return
        self.reached.set()
        if not self.release.wait(timeout=300):
            self.timed_out = True
            return
        tracker = self.trainer.engine.tracker
        deadline = time.monotonic() + 30
        while not self.awaited <= tracker.pending_ops().keys() and time.monotonic() < deadline:
            time.sleep(0.05)
