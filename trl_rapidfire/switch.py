"""The cooperative switch: how one process takes turns between many live ``train()`` calls.

Each run's trainer runs ``train()`` in a thread of its own and never leaves it until the run is
done. Only one thread computes at a time: whoever holds the :class:`Baton`. At a chunk boundary
the run's callback hands the baton back to the scheduler (the main thread) and blocks until the
scheduler gives it the baton again. Because the run never leaves ``train()``, everything the
Trainer keeps in local variables and on the instance (data iterator position, loss
accumulators, the LR scheduler it built, the last-logged step) survives the switch untouched.

What does *not* belong to a run is process-global: the random number generators and
accelerate's shared state. The scheduler saves those when a run hands the baton back and puts
the run's own back before giving it the baton again (:class:`RngState`, and
:func:`~trl_rapidfire.accelerate_state.snapshot_accelerate_state`), so each run sees the
process exactly as it would if it were alone.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "Aborted",
    "Baton",
    "RngState",
]

SCHEDULER = "<scheduler>"


class Aborted(BaseException):
    """Raised inside a suspended run's thread when the experiment ends without it.

    A ``BaseException`` so user code catching ``Exception`` cannot swallow it and keep training.
    """


class Baton:
    """Whose turn it is. Exactly one of the scheduler and the run threads holds it.

    The scheduler calls :meth:`run` (give the baton to a run, wait until it comes back); a run
    thread calls :meth:`wait_turn` once before it starts, :meth:`pass_back` at every chunk
    boundary, and :meth:`release` when it ends (normally or not).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder = SCHEDULER
        self._aborted = False

    @property
    def holder(self) -> str:
        return self._holder

    def run(self, name: str) -> None:
        """Scheduler side: let ``name`` compute, and return when it hands the baton back."""
        with self._cond:
            if self._holder != SCHEDULER:
                raise RuntimeError(f"The baton is held by {self._holder!r}, not the scheduler.")
            self._holder = name
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._holder == SCHEDULER)

    def wait_turn(self, name: str) -> None:
        """Run side: block until the scheduler gives ``name`` the baton."""
        with self._cond:
            self._cond.wait_for(lambda: self._holder == name or self._aborted)
            if self._holder != name:
                raise Aborted(name)

    def pass_back(self, name: str) -> None:
        """Run side: hand the baton to the scheduler and wait for the next turn."""
        with self._cond:
            self._check_holder(name)
            self._holder = SCHEDULER
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._holder == name or self._aborted)
            if self._holder != name:
                raise Aborted(name)

    def release(self, name: str) -> None:
        """Run side: the run's thread is ending; the scheduler has the baton back."""
        with self._cond:
            if self._holder == name:
                self._holder = SCHEDULER
                self._cond.notify_all()

    def abort(self) -> None:
        """Scheduler side: wake every waiting run thread with :class:`Aborted`."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def _check_holder(self, name: str) -> None:
        if self._holder != name:
            raise RuntimeError(f"{name!r} passed back a baton held by {self._holder!r}.")


@dataclass
class RngState:
    """Every process-global random stream a training step may draw from.

    Captured and restored as a whole: torch's CPU generator, every CUDA device's generator,
    Python's ``random`` and NumPy's legacy global generator (what ``set_seed`` seeds).
    """

    torch_cpu: torch.Tensor
    torch_cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any

    @classmethod
    def capture(cls) -> RngState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return cls(torch.get_rng_state(), cuda, random.getstate(), np.random.get_state())

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)
