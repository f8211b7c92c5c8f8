"""The cooperative switch: how one process takes turns between many live ``train()`` calls.

Each run's trainer runs ``train()`` inside a coroutine of its own (a greenlet) and never leaves
it until the run is done. At a chunk boundary the run's callback suspends the coroutine, which
hands control back to the scheduler; resuming it later continues inside the very same
``train()`` call. Because the run never leaves ``train()``, everything the Trainer keeps in
local variables and on the instance (data iterator position, loss accumulators, the LR
scheduler it built, the last-logged step) survives the switch untouched.

Why greenlets and not threads: every OS thread that runs torch ops gets its own OpenMP worker
team, and the teams of suspended threads keep spin-waiting on the cores. Measured on 2 cores
with 4 runs, one thread per run took 1.9-2.3 s where greenlets take 1.5-1.8 s, and single
chunks slowed down up to 10x when another process was busy on the cores
(``OMP_WAIT_POLICY=passive`` hid it, but must be set before torch is imported). All coroutines
run on the caller's thread, so torch sees one thread, one OpenMP team, and the thread-local
state (grad mode, CUDA stream) is what the Trainer left at the boundary.

What does *not* belong to a run is process-global: the random number generators and
accelerate's shared state. The scheduler saves those when a run suspends and puts the run's own
back before resuming it (:class:`RngState`, and
:func:`~trl_rapidfire.accelerate_state.snapshot_accelerate_state`), so each run sees the
process exactly as it would if it were alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from greenlet import greenlet

__all__ = ["Aborted", "RunCoroutine", "RngState"]


class Aborted(BaseException):
    """Raised inside a suspended run when the experiment ends without it.

    A ``BaseException`` so user code catching ``Exception`` cannot swallow it and keep training.
    """


class RunCoroutine:
    """One run's ``train()`` call, suspended at chunk boundaries.

    Created by the scheduler: :meth:`resume` runs ``fn`` (the first time) or continues it, and
    returns when the run calls :meth:`suspend` or ``fn`` ends. An exception that ``fn`` does not
    handle (``KeyboardInterrupt``) comes out of :meth:`resume`.
    """

    def __init__(self, fn: Callable[[], Any], name: str = "run") -> None:
        self.name = name
        self._greenlet = greenlet(fn)

    @property
    def started(self) -> bool:
        return bool(self._greenlet) or self._greenlet.dead

    @property
    def finished(self) -> bool:
        return self._greenlet.dead

    def resume(self) -> None:
        """Scheduler side: let the run compute until it suspends or ends."""
        if self.finished:
            raise RuntimeError(f"{self.name} has already finished.")
        self._greenlet.switch()

    def suspend(self) -> None:
        """Run side: give control back to the scheduler; returns when resumed."""
        if greenlet.getcurrent() is not self._greenlet:
            raise RuntimeError(f"suspend() called outside {self.name}'s own coroutine.")
        self._greenlet.parent.switch()

    def abort(self) -> None:
        """Scheduler side: end a suspended run by raising :class:`Aborted` where it waits."""
        if self._greenlet and not self.finished:
            self._greenlet.throw(Aborted(self.name))


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
