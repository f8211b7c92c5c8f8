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
:func:`~trl_rapidfire.runtime.accelerate_state.snapshot_accelerate_state`), so each run sees the
process exactly as it would if it were alone.
"""

from __future__ import annotations

import ctypes
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from greenlet import greenlet

__all__ = ["Aborted", "RngState", "RunCoroutine", "inside_a_run"]


class Aborted(BaseException):
    """Raised inside a suspended run when the experiment ends without it.

    A ``BaseException`` so user code catching ``Exception`` cannot swallow it and keep training.
    """


class _RunGreenlet(greenlet):
    """A run's own greenlet (what :func:`inside_a_run` recognizes)."""


def inside_a_run() -> bool:
    """Whether the caller is inside a run's ``train()`` (a callback, a hook), not between
    turns: what must not happen there (building another run's trainer, say) can be refused."""
    return isinstance(greenlet.getcurrent(), _RunGreenlet)


class RunCoroutine:
    """One run's ``train()`` call, suspended at chunk boundaries.

    Created by the scheduler: :meth:`resume` runs ``fn`` (the first time) or continues it, and
    returns when the run calls :meth:`suspend` or ``fn`` ends. An exception that ``fn`` does not
    handle (``KeyboardInterrupt``) comes out of :meth:`resume`.
    """

    def __init__(self, fn: Callable[[], Any], name: str = "run") -> None:
        self.name = name
        self._greenlet = _RunGreenlet(fn)

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


# NumPy's legacy global generator costs ~70 us a switch to read and write whole (its state
# is a 624-word array), a tenth of a 1-step turn on the tiny model, though training steps
# rarely draw from it. Its bit generator's raw state (the key and position of MT19937, through
# NumPy's public ctypes interface) reads in under a microsecond, so the whole state is read or
# written only when those bytes say it may have moved. What makes a skip exact: a draw from a
# state without a cached Gaussian (``has_gauss == 0``) always advances the raw state (a
# Gaussian is made from uniform draws, and only a *cached* one is returned without any), so
# while the raw bytes stay what they were when the whole state was last known, and that state
# had no cached Gaussian, the whole state is still that one. A state with a cached Gaussian
# is always read and written whole.
_MT_KEY_WORDS = 624
_MT_RAW_BYTES = _MT_KEY_WORDS * 4 + 4  # uint32 key[624]; int pos
_raw_layout_ok: bool | None = None  # checked against get_state() the first time
# (raw bytes, the whole state) as of the last time this module read or wrote the state
_numpy_known: tuple[bytes, Any] | None = None


def _numpy_raw() -> bytes | None:
    """The raw bytes of NumPy's global MT19937 state, or ``None`` where they cannot be read
    (another bit generator, or a layout that does not match what ``get_state`` reports)."""
    global _raw_layout_ok
    if _raw_layout_ok is False:
        return None
    get_bit_generator = getattr(np.random, "get_bit_generator", None)
    bit_generator = get_bit_generator() if get_bit_generator is not None else None
    if type(bit_generator) is not np.random.MT19937:
        return None
    raw = ctypes.string_at(bit_generator.ctypes.state_address, _MT_RAW_BYTES)
    if _raw_layout_ok is None:
        # legacy=True is get_state()'s default, written out: numpy's stub types the call
        # without it as the dict form; an MT19937's legacy state is the tuple.
        state = np.random.get_state(legacy=True)
        assert isinstance(state, tuple)
        key = np.ascontiguousarray(state[1], dtype="<u4").tobytes()
        _raw_layout_ok = (sys.byteorder == "little" and raw[: _MT_KEY_WORDS * 4] == key
                          and int.from_bytes(raw[-4:], "little", signed=True) == state[2])
        if not _raw_layout_ok:
            return None
    return raw


def _numpy_state_now() -> tuple[Any, bytes | None]:
    """NumPy's legacy global state (``get_state()``'s tuple) and its raw bytes."""
    global _numpy_known
    raw = _numpy_raw()
    known = _numpy_known
    if raw is not None and known is not None and known[0] == raw and known[1][3] == 0:
        return known[1], raw
    state = np.random.get_state()
    _numpy_known = (raw, state) if raw is not None else None
    return state, raw


def _set_numpy_state(state: Any, raw: bytes | None) -> None:
    """Make ``state`` (with raw bytes ``raw``, when known) NumPy's legacy global state."""
    global _numpy_known
    now = _numpy_raw()
    known = _numpy_known
    if (raw is not None and now == raw and state[3] == 0 and known is not None
            and known[0] == now and known[1][3] == 0 and known[1][4] == state[4]):
        return  # the whole state is this one already
    np.random.set_state(state)
    after = _numpy_raw()
    _numpy_known = (after, state) if after is not None else None


@dataclass
class RngState:
    """Every process-global random stream a training step may draw from.

    Captured and restored as a whole: torch's CPU generator, every CUDA device's generator,
    Python's ``random`` and NumPy's legacy global generator (what ``set_seed`` seeds).
    """

    torch_cpu: torch.Tensor
    torch_cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any  # np.random.get_state()'s tuple
    numpy_raw: bytes | None = None  # its generator's raw bytes (None: not known)

    @classmethod
    def capture(cls) -> RngState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        numpy, raw = _numpy_state_now()
        return cls(torch.get_rng_state(), cuda, random.getstate(), numpy, raw)

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        _set_numpy_state(self.numpy, self.numpy_raw)
