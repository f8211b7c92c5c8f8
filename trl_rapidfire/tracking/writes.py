"""The tracker's queued writes: each run's metric points, tags and MLflow status, held in memory
for the engine (which only queues them) and written by the tracking thread, a run at a time,
in as few calls as it can.

A run whose MLflow run is not made yet (registration runs in the background) keeps its writes,
in order, until it is. A run's own MLflow status (the UI's status icon, ``attributes.status``
in a search) is written only when it changes: from its status tag
(:func:`~.tags.mlflow_status_of`), from an end queued for it, or from a status set as such
(``SCHEDULED``: a run left pending when a ``train()`` call ended).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from functools import partial

from .background import BackgroundThread
from .link import Connection, Link
from .registration import Registrar, RunHandle
from .tags import STATUS_TAG, mlflow_status_of

__all__ = ["ENDED", "Point", "RunWrites"]

ENDED = frozenset({"FINISHED", "FAILED", "KILLED"})  # MLflow's statuses with an end time
Point = tuple[str, float, int, int]  # (key, value, step, timestamp in ms)


class RunWrites:
    """Points, tags and statuses queued by run, written on the tracking thread.

    Args:
        runs: the registered runs (a run not made yet keeps its writes).
        link: the store (opened on the thread).
        thread: the tracking thread.
    """

    def __init__(self, runs: Registrar, link: Link, thread: BackgroundThread) -> None:
        self._runs, self._link, self._thread = runs, link, thread
        self._lock = threading.Lock()
        self._points: dict[str, list[Point]] = {}
        # A tag's value, or None: the tag is removed.
        self._tags: dict[str, dict[str, str | None]] = {}
        self._statuses: dict[str, str] = {}  # MLflow statuses set as such (ends, SCHEDULED)

    # ------------------------------------------------------------------ any thread

    def log_metrics(self, name: str, points: list[Point]) -> None:
        """Queue ``points`` of run ``name``."""
        if points:
            with self._lock:
                self._points.setdefault(name, []).extend(points)

    def set_tags(self, name: str, tags: Mapping[str, str | None]) -> None:
        """Queue tag updates of run ``name`` (``None``: remove the tag); the latest value of
        each tag is written."""
        with self._lock:
            self._tags.setdefault(name, {}).update(tags)

    def drop_tag(self, name: str, key: str) -> None:
        """Forget a queued value of ``key`` on ``name`` (an answer written since replaces
        it)."""
        with self._lock:
            self._tags.get(name, {}).pop(key, None)

    def set_status(self, name: str, status: str) -> None:
        """Queue MLflow ``status`` for run ``name`` (after its queued points and tags), and ask
        the thread to write it soon."""
        with self._lock:
            self._statuses[name] = status
        self._thread.put(self.write_pending)

    # ------------------------------------------------------------------ the tracking thread

    def write_pending(self) -> None:
        """Write what is queued, one job per run (a run MLflow refuses does not keep the
        others' writes out)."""
        with self._lock:
            points, self._points = self._points, {}
            tags, self._tags = self._tags, {}
            statuses, self._statuses = self._statuses, {}
            names = list({**points, **tags, **statuses})
            # A run whose MLflow run is not made yet keeps its writes, in order, for later.
            # (Only this thread makes runs: none is made between this test and the hold.)
            held = [n for n in names if self._runs.waiting(n)]
            self._hold(held, points, tags, statuses)
        self._runs.retry()  # a registration that failed is tried again
        ready = [n for n in names if n not in held]
        if not ready:
            return
        conn = self._link.get()
        if conn is None:
            with self._lock:
                self._hold(ready, points, tags, statuses)
            return
        for name in ready:
            self._thread.run_guarded(partial(self._write_run, conn, name,
                                             points.get(name, []), tags.get(name, {})))
            if name in statuses:
                self._thread.run_guarded(partial(self._status, conn, name, statuses[name]))

    def _hold(self, names: list[str], points: dict[str, list[Point]],
              tags: dict[str, dict[str, str | None]], statuses: dict[str, str]) -> None:
        """Put the writes of ``names`` back in front of what was queued since (under _lock)."""
        for name in names:
            if name in points:
                self._points[name] = points[name] + self._points.get(name, [])
            if name in tags:
                self._tags[name] = {**tags[name], **self._tags.get(name, {})}
            if name in statuses:
                self._statuses.setdefault(name, statuses[name])

    def _write_run(self, conn: Connection, name: str, points: list[Point],
                   tags: Mapping[str, str | None]) -> None:
        # One call per run and write: its new points and its tags together.
        from mlflow.entities import Metric, RunTag

        handle = self._handle(name)
        run_tags = [RunTag(k, str(v)[:5000]) for k, v in tags.items() if v is not None]
        metrics = []
        for key, value, step, ts in points:
            seen = handle.steps.setdefault(key, set())
            if step in seen or not math.isfinite(value):
                continue
            seen.add(step)
            metrics.append(Metric(key, float(value), ts, step))
        for i in range(0, max(len(metrics), 1), 1000):
            batch = metrics[i:i + 1000]
            if batch or run_tags:
                conn.client.log_batch(handle.run_id, metrics=batch, tags=run_tags)
            run_tags = []
        for key in (k for k, v in tags.items() if v is None):
            _delete_tag(conn, handle.run_id, key)
        status = tags.get(STATUS_TAG)
        if status is not None:
            set_status(conn, handle, mlflow_status_of(status))

    def _status(self, conn: Connection, name: str, status: str) -> None:
        set_status(conn, self._handle(name), status)

    def _handle(self, name: str) -> RunHandle:
        handle = self._runs.handle(name)
        if handle is None:  # a name never registered: noted (KeyError), as before
            raise KeyError(name)
        return handle


def set_status(conn: Connection, handle: RunHandle, status: str | None) -> None:
    """Give the run MLflow's ``status`` when it holds another: an ending one with its end
    time, another (``RUNNING`` again for a resumed or re-run run, ``SCHEDULED``) as it is."""
    if status is None or status == handle.mlflow_status:
        return
    if status in ENDED:
        conn.client.set_terminated(handle.run_id, status)
    else:
        conn.client.update_run(handle.run_id, status=status)
    handle.mlflow_status = status


def _delete_tag(conn: Connection, run_id: str, key: str) -> None:
    """Remove tag ``key`` from the run; a tag it does not have is no error (the removal says
    what should be true, as a set tag does)."""
    from mlflow.exceptions import MlflowException

    try:
        conn.client.delete_tag(run_id, key)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
