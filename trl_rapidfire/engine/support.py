"""Small pieces the engine's modules share: disk faults, the experiment's wall clock, lease
renewal, Ctrl-C, what goes into the shared state and MLflow, and the engine's attributes that
its collaborators keep."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from ..config.knobs import describe_value
from ..control.ops import OpError, parse_op
from ..runtime.worker_info import launcher_gone
from ..shared_state.store import StateStore, renew
from ..storage.faults import ExperimentFault, disk_fault, fault_message
from ..storage.outside_text import STATE_BYTES, OutsideTextError
from ..storage.own_files import read_json

__all__ = [
    "FaultNote",
        "LeaseKeeper",
    "WallClock",
    "canonical_op",
    "disk_faults",
    "install_sigint",
    "json_knobs",
    "load_trainer_state",
    "one_line",
    "orphaned",
    "points_of",
]


@contextlib.contextmanager
def disk_faults(what: str, path: Path) -> Iterator[None]:
    """Our own writes: a disk fault becomes an :class:`ExperimentFault` naming ``path``."""
    try:
        yield
    except ExperimentFault:
        raise
    except Exception as exc:
        detail = disk_fault(exc, ours=True)
        if detail is None:
            raise
        raise ExperimentFault(fault_message(what, path, detail)) from exc


class FaultNote:
    """The disk fault that stopped the experiment (faults.py): this engine trains no more; a
    re-run of the script continues from the last recorded boundaries. The first fault noted
    is the one reported."""

    def __init__(self) -> None:
        self.message: str | None = None

    def note(self, message: str | None) -> None:
        self.message = self.message or message

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """An :class:`ExperimentFault` raised in the body is noted, not raised."""
        try:
            yield
        except ExperimentFault as exc:
            self.note(str(exc))


class WallClock:
    """Training wall time of the experiment: earlier sessions' (from the shared state) plus
    this ``run()`` call's so far."""

    def __init__(self) -> None:
        self.before = 0.0  # training wall time of earlier sessions
        self.started: float | None = None  # when this run() call started (perf_counter)

    def seconds(self) -> float:
        running = time.perf_counter() - self.started if self.started is not None else 0.0
        return self.before + running


def canonical_op(text: str) -> str:
    """The op as the shared state records it (``str(parse_op(text))``), or ``text``."""
    try:
        return str(parse_op(text))
    except OpError:
        return text


def json_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    # The shared state is JSON: a LoRA config or a function is kept as its description.
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else describe_value(v)
            for k, v in knobs.items()}


def load_trainer_state(path: Path) -> Any:
    """A checkpoint's ``trainer_state.json``, read within the bounds of any state file (it is
    in the experiment's folder, which others may write to); errors name the file."""
    from transformers import TrainerState

    doc = read_json(path, max_bytes=STATE_BYTES)
    if not isinstance(doc, dict):
        raise OutsideTextError(f"{path} is not a trainer state (a JSON object)")
    try:
        return TrainerState(**doc)
    except TypeError as err:
        raise OutsideTextError(f"{path} is not a trainer state: {err}") from None


def one_line(err: BaseException, limit: int = 500) -> str:
    """``err``'s message as one line of at most ``limit`` characters (for an op's answer)."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[:limit] + "..."


def points_of(log_history: list[dict[str, Any]]) -> list[tuple[str, float, int, int]]:
    now = int(time.time() * 1000)
    return [
        (key, float(value), int(entry.get("step", 0)), now)
        for entry in log_history for key, value in entry.items()
        if key not in ("step",) and isinstance(value, (int, float)) and not isinstance(value, bool)
    ]


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

    def handler(signum: int, frame: Any) -> None:
        if engine.interrupted:
            raise KeyboardInterrupt
        engine.interrupted = True
        print(  # noqa: T201 - the person pressing Ctrl-C needs to know what happens
            "\ntrl-rapidfire: stopping at the next chunk boundary (Ctrl-C again to stop now; "
            "finished chunks are kept either way, re-run the script to continue)",
            flush=True,
        )

    return signal.signal(signal.SIGINT, handler)
