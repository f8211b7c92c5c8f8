"""The one thread that talks to MLflow for an experiment, never on the training path.

It runs queued jobs first, in order, and between them its periodic work (writing the queued
points and tags, polling the control tags, the heartbeat), each every so many seconds while
it is wanted. An error MLflow raises in a job is kept (:attr:`BackgroundThread.errors`), never
raised: tracking must not stop training.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BackgroundThread", "Periodic"]

Job = Callable[[], None]


@dataclass(frozen=True)
class Periodic:
    """Work done every ``interval`` seconds, when ``wanted()`` says so at that time."""

    interval: float
    job: Job
    wanted: Callable[[], bool] = lambda: True


class BackgroundThread:
    """A daemon thread running jobs one at a time (started on demand, stopped by
    :meth:`stop`: between ``train()`` calls nothing of the experiment stays alive).

    ``active`` is cleared while the engine switches runs: MLflow calls are milliseconds of
    Python under the GIL, so a job waits for the next chunk, when torch kernels release it.
    """

    def __init__(self, name: str, periodic: Sequence[Periodic]) -> None:
        self._name = name
        self._periodic = list(periodic)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._stop = threading.Event()
        self._errors: list[str] = []
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self.active = threading.Event()
        self.active.set()

    def start(self) -> None:
        """The thread, (re)started if :meth:`stop` stopped it."""
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name=self._name,
                                                daemon=True)
                self._thread.start()

    def is_current(self) -> bool:
        """Whether the caller runs on this thread (a job: it must not wait for a later one)."""
        return threading.current_thread() is self._thread

    def put(self, job: Job) -> None:
        """Queue ``job`` (after the jobs queued before it)."""
        self.start()
        self._jobs.put(job)

    def run_and_wait(self, job: Job, timeout: float) -> None:
        """Queue ``job`` and wait (at most ``timeout`` seconds) until it has run."""
        self.active.set()
        done = threading.Event()

        def then_done() -> None:
            try:
                job()
            finally:
                done.set()

        self.put(then_done)
        done.wait(timeout=timeout)

    def stop(self) -> None:
        """End the thread once the jobs queued so far have run."""
        with self._thread_lock:
            if self._thread is not None and self._thread.is_alive():
                self._stop.set()
                self._jobs.put(lambda: None)
                self._thread.join(timeout=30)

    def note_error(self, text: str) -> None:
        """Keep an error a job met without raising it."""
        self._errors.append(text)

    @property
    def errors(self) -> list[str]:
        """Errors the jobs met (training went on)."""
        return list(self._errors)

    def run_guarded(self, job: Job) -> None:
        """Run ``job`` now, on the calling thread (a job's own parts: one failing part does
        not stop the others), keeping its error."""
        self.active.wait()
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            self.note_error(f"{type(exc).__name__}: {exc}")

    def _loop(self) -> None:
        due = [0.0] * len(self._periodic)
        while True:
            timeout = max(min(due, default=1.0) - time.monotonic(), 0.0)
            try:
                job = self._jobs.get(timeout=timeout)
            except queue.Empty:
                job = None
            if job is not None:
                self.run_guarded(job)
                if self._stop.is_set() and self._jobs.empty():
                    return
                continue
            if self._stop.is_set():
                return
            now = time.monotonic()
            for i, work in enumerate(self._periodic):
                if now >= due[i]:
                    if work.wanted():
                        self.run_guarded(work.job)
                    due[i] = time.monotonic() + work.interval
