"""This worker's time in the experiment: its wall clock, the lease that keeps its claim while
a chunk trains, and how it stops early (Ctrl-C, a launcher that died)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any, Protocol

from ..runtime.workers import launcher_gone
from ..shared_state.store import StateStore, renew

__all__ = ["Interruptible", "LeaseKeeper", "WallClock", "install_sigint", "orphaned",
           "stopped_by_ctrl_c"]

# {again}: how this person continues (a script is run again; a notebook calls train() again).
_GRACEFUL = ("stopped at a chunk boundary: every finished chunk is kept; {again} to continue "
             "where it stopped.")
_NOW = ("stopped at once, mid-chunk: each run is kept as of its last finished chunk (the "
        "chunk in progress is trained again when you {again}).")
_WHILE_WRITING = ("left while writing the runs' states: what was written is kept; the chunks "
                  "not written yet are trained again when you {again}.")


def _again() -> str:
    """How to continue an experiment stopped by Ctrl-C, as this person runs it: in a Jupyter
    kernel the trainer is still there, and its next ``train()`` continues."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
        return "call train() again"
    return "run the same script again"


def stopped_by_ctrl_c(message: str = _GRACEFUL) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` that ends a ``train()`` call stopped by Ctrl-C: its message
    is one line saying what was kept. A script that does not catch it ends with that line
    alone, not a traceback, and still with Ctrl-C's exit status (CPython exits by SIGINT only
    for a ``KeyboardInterrupt`` itself, no subclass: hence a marked instance); a notebook
    shows the line alone too (IPython's ``_render_traceback_``)."""
    line = f"trl-rapidfire: {message.format(again=_again())}"
    err = KeyboardInterrupt(line)
    err.rapidfire_line = line  # type: ignore[attr-defined]
    err._render_traceback_ = lambda: [line]  # type: ignore[attr-defined]
    return err


def _quiet_hook(previous: Any) -> Any:
    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        line = getattr(value, "rapidfire_line", None)
        if isinstance(value, KeyboardInterrupt) and isinstance(line, str):
            print(line, file=sys.stderr, flush=True)  # noqa: T201 - instead of its frames
            return
        previous(kind, value, tb)

    hook.rapidfire_quiet = True  # type: ignore[attr-defined]
    return hook


def _install_quiet_exit() -> None:
    """An uncaught :func:`stopped_by_ctrl_c` ends a script with its line, not a traceback; any
    other exception goes to the hook that was there (set once per process)."""
    if not getattr(sys.excepthook, "rapidfire_quiet", False):
        sys.excepthook = _quiet_hook(sys.excepthook)


class WallClock:
    """Training wall time of the experiment: earlier sessions' (from the shared state) plus
    this ``run()`` call's so far."""

    def __init__(self) -> None:
        self.before = 0.0  # training wall time of earlier sessions
        self.started: float | None = None  # when this run() call started (perf_counter)

    def seconds(self) -> float:
        running = time.perf_counter() - self.started if self.started is not None else 0.0
        return self.before + running


class LeaseKeeper:
    """Renews this worker's claim while a chunk trains (a thread: the chunk holds the main
    one). On this machine a dead worker is noticed by its pid; the lease is what tells workers
    on other machines.

    One thread for the experiment, told which claim to keep at each turn: starting a thread
    per turn cost ~2 ms of the switch on a busy 2-core machine."""

    def __init__(self, store: StateStore, worker: str) -> None:
        self._store, self._worker = store, worker
        self._held: tuple[str, float] | None = None  # (run, lease seconds)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, run: str, lease_seconds: float) -> None:
        """Keep ``run``'s claim alive until :meth:`drop`."""
        self._held = (run, lease_seconds)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="rapidfire-lease",
                                            daemon=True)
            self._thread.start()

    def drop(self) -> None:
        """The turn is over: renew nothing until the next :meth:`hold`."""
        self._held = None

    def close(self) -> None:
        """The ``run()`` call ended: the thread ends (the next :meth:`hold` starts one)."""
        self._held = None
        thread, self._thread = self._thread, None
        if thread is not None:
            self._wake.set()
            thread.join(timeout=30)
            self._wake.clear()

    def _loop(self) -> None:
        while True:
            held = self._held
            self._wake.wait(held[1] / 4 if held else 1.0)
            if self._wake.is_set():
                return
            held = self._held
            if held is None:
                continue
            try:
                with self._store.transaction(durable=False) as st:
                    renew(st, held[0], self._worker, now=time.time(), lease_seconds=held[1])
            except Exception:  # noqa: BLE001 - the next renewal retries
                pass


def orphaned(rank: int) -> bool:
    """Whether this worker's launcher died (killed alone); if so, says so once."""
    launcher = launcher_gone()
    if launcher is None:
        return False
    print(  # noqa: T201 - said once, as the worker leaves
        f"trl-rapidfire: worker {rank}: its launcher (pid {launcher}) is gone; "
        "stopping at this chunk boundary (finished chunks are kept; run the launch again "
        "to continue)", file=sys.stderr, flush=True)
    return True


class Interruptible(Protocol):
    interrupted: bool


def install_sigint(engine: Interruptible) -> Any:
    """First Ctrl-C: finish the chunk in progress, then stop. Second: stop now."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _install_quiet_exit()

    def handler(signum: int, frame: Any) -> None:
        if engine.interrupted:
            # Raised wherever training is (a torch.save included); the run() call's ending
            # still writes each run's last chunk boundary before it leaves (engine/core.py).
            raise stopped_by_ctrl_c(_NOW)
        engine.interrupted = True
        print(  # noqa: T201 - the person pressing Ctrl-C needs to know what happens
            "\ntrl-rapidfire: stopping at the next chunk boundary (Ctrl-C again to stop now; "
            f"finished chunks are kept either way: {_again()} to continue)",
            flush=True,
        )

    return signal.signal(signal.SIGINT, handler)


def install_ending_sigint() -> Any:
    """While a ``run()`` call ends (its finished chunks written, its runs' states recorded and
    sent to the tracker): the first Ctrl-C says what is being kept and goes on; a second one
    leaves at once (what was not written yet is trained again by a re-run). Without it, a
    Ctrl-C there broke off a checkpoint write or the tracker's last flush with a traceback,
    and the experiment's views said "training" until its heartbeat went stale."""
    if threading.current_thread() is not threading.main_thread():
        return None
    pressed: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        if pressed:
            raise stopped_by_ctrl_c(_WHILE_WRITING)
        pressed.append(True)
        print(  # noqa: T201 - the person pressing Ctrl-C needs to know what happens
            "\ntrl-rapidfire: writing what was trained and the runs' states (a few seconds; "
            "Ctrl-C again to leave now: chunks not written yet are trained again when you "
            f"{_again()})",
            flush=True,
        )

    return signal.signal(signal.SIGINT, handler)
