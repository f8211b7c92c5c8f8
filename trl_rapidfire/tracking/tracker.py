"""MLflow tracking: one parent run per experiment, one child run per RF run, and run tags as the
control channel.

Everything that talks to MLflow runs on one background thread, never on the training path: the
engine *enqueues* (a chunk's metric points after the chunk ends, tag updates, run ends) and
reads the latest polled control tags from memory. The thread writes what is queued every two
seconds in as few calls as it can and, about once a second, polls the control tags of the
whole experiment with a single query.

Where: ``MLFLOW_TRACKING_URI`` if set, else a sqlite store ``mlflow.db`` in the working
directory (MLflow's own default, made explicit). Which experiment: ``MLFLOW_EXPERIMENT_NAME``
if set, else the base name of ``output_dir``. Runs are found by the tag
``rapidfire.experiment`` (an id kept in ``<output_dir>/.rapidfire/experiment.json``) plus the
run name, so two output folders with the same base name never mix, and a re-run of the same
script on the same folder continues the same MLflow runs.

Ops (docs/ic-ops.md): once the engine applied a run's ``rapidfire.op``, the tag is removed if
it still holds that text, and only then are ``rapidfire.op.result`` and ``rapidfire.op.seq``
written, so a person who waits for either before setting the next op never loses it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from .mlflow_store import TrackingStoreError, ensure_schema
from .tags import (
    EXPERIMENT_TAG,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_STALE,
    HEARTBEAT_TAG,
    OP_RESULT_TAG,
    OP_SEQ_TAG,
    OP_TAG,
    ROLE_TAG,
    RUN_TAG,
    STATUS_TAG,
    experiment_id_for,
    resolve_tracking_uri,
)

# The tag names stay importable from here (tracking_tags.py holds them for readers).
__all__ = [
    "OP_RESULT_TAG",
    "OP_SEQ_TAG",
    "OP_TAG",
    "HEARTBEAT_STALE",
    "HEARTBEAT_TAG",
    "Tracker",
    "TrackingStoreError",
    "experiment_id_for",
    "resolve_tracking_uri",
]

_MLFLOW_STATUS = {"completed": "FINISHED", "failed": "FAILED", "stopped": "KILLED",
                  "deleted": "KILLED"}
# How a train() call ended -> the parent run's MLflow status.
_EXPERIMENT_STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
_PARAM_VALUE_MAX = 6000


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr, sort_keys=True)
    return text if len(text) <= _PARAM_VALUE_MAX else text[: _PARAM_VALUE_MAX - 3] + "..."


@dataclass
class _Consumed:
    """An applied op whose tag polls may still show, until a poll that began after our
    compare-and-delete completed (``done_at``, the tracker's clock): the same text is then a
    new op."""

    op: str
    done_at: int | None = None


@dataclass
class _RunHandle:
    run_id: str
    # metric key -> steps already in the store. A set, not the last step: after a crash, a
    # re-run logs the points that never reached MLflow while later steps may already be there.
    steps: dict[str, set[int]]


class Tracker:
    """The experiment's MLflow runs and the background thread that talks to MLflow.

    Args:
        output_dir: the experiment folder (its base name names the MLflow experiment).
        uri: tracking URI (default :func:`resolve_tracking_uri`).
        experiment_name: default ``MLFLOW_EXPERIMENT_NAME`` or the base name of ``output_dir``.
        poll_interval: seconds between two polls of the control tags.
        write_interval: seconds between two writes of queued points and tags.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        *,
        uri: str | None = None,
        experiment_name: str | None = None,
        poll_interval: float = 1.0,
        write_interval: float = 2.0,
    ) -> None:
        from mlflow import MlflowClient

        self.uri = uri or resolve_tracking_uri()
        self.experiment_name = (
            experiment_name
            or os.environ.get("MLFLOW_EXPERIMENT_NAME")
            or Path(output_dir).resolve().name
        )
        # Workers of one experiment set up at the same time: one at a time finds or creates
        # the experiment and its runs, so none is created twice.
        from filelock import FileLock

        (Path(output_dir) / ".rapidfire").mkdir(parents=True, exist_ok=True)
        self._setup_lock = FileLock(str(Path(output_dir) / ".rapidfire" / "tracking.lock"),
                                    is_singleton=True)
        with self._setup_lock:
            self.rf_experiment = experiment_id_for(output_dir)
        self.poll_interval = poll_interval
        self.write_interval = write_interval
        self._pending_points: dict[str, list[tuple[str, float, int, int]]] = {}
        self._pending_tags: dict[str, dict[str, str]] = {}
        ensure_schema(self.uri)
        self.client = MlflowClient(self.uri)
        with self._setup_lock:
            exp = self.client.get_experiment_by_name(self.experiment_name)
            self.experiment_id = (
                exp.experiment_id if exp is not None
                else self.client.create_experiment(self.experiment_name)
            )
        self._runs: dict[str, _RunHandle] = {}
        self._ops: dict[str, str] = {}
        self._seen: dict[str, str] = {}  # run name -> MLflow run id, of every polled child run
        self._consumed: dict[str, _Consumed] = {}
        self._clock = itertools.count(1)  # orders polls and deletes (next() is atomic)
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._errors: list[str] = []
        self._stop = threading.Event()
        self.polling = threading.Event()  # set while an experiment trains
        self._beating = False  # between experiment_started() and experiment_ended()
        self.polling.set()
        # Cleared while the engine switches runs: MLflow calls are milliseconds of Python under
        # the GIL, so the thread waits for the next chunk, when torch kernels release the GIL.
        self.active = threading.Event()
        self.active.set()
        with self._setup_lock:
            self.parent_run_id = self._find_or_create("", role="experiment")
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._ensure_thread()

    # ------------------------------------------------------------------ runs

    def _search(self, extra: str = "") -> list[Any]:
        flt = f"tags.`{EXPERIMENT_TAG}` = '{self.rf_experiment}'" + extra
        return self.client.search_runs([self.experiment_id], filter_string=flt, max_results=5000)

    def _find_or_create(self, name: str, *, role: str, tags: Mapping[str, str] | None = None
                        ) -> str:
        found = self._search(f" and tags.`{ROLE_TAG}` = '{role}'")
        for run in found:
            if run.data.tags.get(RUN_TAG, "") == name:
                return run.info.run_id
        all_tags = {EXPERIMENT_TAG: self.rf_experiment, ROLE_TAG: role, RUN_TAG: name}
        if role == "run":
            all_tags["mlflow.parentRunId"] = self.parent_run_id
        all_tags.update(tags or {})
        return self.client.create_run(
            self.experiment_id, tags=all_tags,
            run_name=name or f"{self.experiment_name} ({self.rf_experiment[:8]})").info.run_id

    def ensure_run(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        """The MLflow run of RF run ``name``: found (a re-run) or created with ``params``.

        Called while setting up, before training: synchronous. Params are logged once (MLflow
        forbids changing them); on a re-run only the missing ones are added.
        """
        from mlflow.entities import Param

        # All of it under the setup lock: the workers of a launch set up the same runs at the
        # same time, and a tracking server refuses a param logged twice (a sqlite store
        # opened directly let the second, equal value pass).
        with self._setup_lock:
            run_id = self._find_or_create(name, role="run", tags=tags)
            run = self.client.get_run(run_id)
            have = run.data.params
            new = [Param(k[:250], _param_value(v)) for k, v in params.items()
                   if k[:250] not in have]
            for i in range(0, len(new), 100):
                self.client.log_batch(run_id, params=new[i:i + 100])
            # A found run's status is the engine's to change: a re-build of the same trainer
            # (or a slow worker of a launch) must not turn a completed run back to pending.
            if STATUS_TAG not in run.data.tags:
                self.client.set_tag(run_id, STATUS_TAG, tags.get(STATUS_TAG, "pending"))
        steps = {key: {m.step for m in self.client.get_metric_history(run_id, key)}
                 for key in run.data.metrics}
        with self._lock:
            self._runs[name] = _RunHandle(run_id, steps)
        return run_id

    def run_id(self, name: str) -> str:
        return self._runs[name].run_id

    # ------------------------------------------------------------------ queued writes

    def log_metrics(self, name: str, points: list[tuple[str, float, int, int]]) -> None:
        """Queue ``(key, value, step, timestamp_ms)`` points of run ``name``.

        Points and tags go out together every ``write_interval`` seconds (or at :meth:`flush`):
        one write for many chunks keeps MLflow's cost off the training thread. A point at a
        step the store has for that key (a re-run retraining) is skipped.
        """
        if points:
            with self._lock:
                self._pending_points.setdefault(name, []).extend(points)

    def _new_metrics(self, name: str, points: list[tuple[str, float, int, int]]) -> list[Any]:
        from mlflow.entities import Metric

        handle = self._runs[name]
        metrics = []
        for key, value, step, ts in points:
            seen = handle.steps.setdefault(key, set())
            if step in seen or not math.isfinite(value):
                continue
            seen.add(step)
            metrics.append(Metric(key, float(value), ts, step))
        return metrics

    def set_tags(self, name: str, tags: Mapping[str, str]) -> None:
        """Queue tag updates of run ``name``; the latest value of each tag is written with the
        next batch."""
        with self._lock:
            self._pending_tags.setdefault(name, {}).update(tags)

    def _write_pending(self) -> None:
        with self._lock:
            points, self._pending_points = self._pending_points, {}
            tags, self._pending_tags = self._pending_tags, {}
        for name in {**points, **tags}:
            self._run_job(partial(self._write_run, name, points.get(name, []),
                                  tags.get(name, {})))

    def _write_run(self, name: str, points: list[tuple[str, float, int, int]],
                   tags: Mapping[str, str]) -> None:
        # One call per run and write: its new points and its tags together.
        from mlflow.entities import RunTag

        run_tags = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        metrics = self._new_metrics(name, points)
        handle = self._runs[name]
        for i in range(0, max(len(metrics), 1), 1000):
            batch = metrics[i:i + 1000]
            if batch or run_tags:
                self.client.log_batch(handle.run_id, metrics=batch, tags=run_tags)
            run_tags = []

    def end_run(self, name: str, status: str) -> None:
        """Queue the end of run ``name`` with the MLflow status matching RF ``status`` (after
        its last points and tags)."""
        mlflow_status = _MLFLOW_STATUS.get(status)
        if mlflow_status is not None:
            def job() -> None:
                self._write_pending()
                self.client.set_terminated(self._runs[name].run_id, mlflow_status)

            self._put(job)

    # ------------------------------------------------------------------ the experiment

    def experiment_started(self) -> None:
        """A ``train()`` call begins: the parent run is (again) running, with a heartbeat
        from now on, so a re-run reopens what the last call ended."""
        def job() -> None:
            self.client.update_run(self.parent_run_id, status="RUNNING")
            self._beat()

        self._beating = True
        self._put(job)

    def experiment_ended(self, outcome: str) -> None:
        """A ``train()`` call ended (``finished``, ``failed`` or ``killed``): the parent run
        ends with that status, after what is queued before it."""
        self._beating = False
        status = _EXPERIMENT_STATUS[outcome]

        def job() -> None:
            self._write_pending()
            self.client.set_terminated(self.parent_run_id, status)

        self._put(job)

    def _beat(self) -> None:
        self.client.set_tag(self.parent_run_id, HEARTBEAT_TAG, str(int(time.time())))

    # ------------------------------------------------------------------ control tags

    def pending_ops(self) -> dict[str, str]:
        """Run name -> the op text set on it and not yet consumed (latest poll)."""
        with self._lock:
            return {n: op for n, op in self._ops.items() if not self._is_consumed(n, op)}

    def _is_consumed(self, name: str, op: str) -> bool:
        return name in self._consumed and self._consumed[name].op == op

    def consume_op(self, name: str, op: str, result: str) -> None:
        """The engine applied (or rejected) ``op``: remove the tag, then write the result."""
        # A run this process never set up (e.g. a name no run has) is answered too.
        run_id = self._runs[name].run_id if name in self._runs else self._seen.get(name)
        if run_id is None:
            return
        with self._lock:
            self._consumed[name] = _Consumed(op)
            # An older result queued for this run (a policy's) must not land after this answer.
            self._pending_tags.get(name, {}).pop(OP_RESULT_TAG, None)
        self._put(partial(self._answer, name, run_id, op, result))

    def _answer(self, name: str, run_id: str, op: str, result: str) -> None:
        """Compare-and-delete the op tag first, then write the result and the answer count: a
        person sets the next op once this one's tag is gone (or its answer is there), when the
        delete is done and cannot remove it. Another text found there was set over this op
        before its answer (against the protocol) and stays pending."""
        from mlflow.entities import RunTag

        tags = self.client.get_run(run_id).data.tags
        removed = True
        if tags.get(OP_TAG) == op:
            try:
                self.client.delete_tag(run_id, OP_TAG)
            except Exception as exc:  # noqa: BLE001 - gone meanwhile is fine; else say so
                removed = self.client.get_run(run_id).data.tags.get(OP_TAG) != op
                if not removed:  # the tag stays filtered: the op was applied once
                    self._errors.append(f"removing {name}'s op tag: {type(exc).__name__}: {exc}")
        done = next(self._clock)
        with self._lock:
            marker = self._consumed.get(name)
            if removed and marker is not None and marker.op == op:
                marker.done_at = done
        count = tags.get(OP_SEQ_TAG, "0")
        seq = int(count) + 1 if count.isdigit() else 1  # one consumer: no lost increments
        self.client.log_batch(run_id, tags=[RunTag(OP_RESULT_TAG, result[:5000]),
                                            RunTag(OP_SEQ_TAG, str(seq))])

    def poll_now(self) -> None:
        """Poll the control tags synchronously (tests; the thread polls on its own)."""
        self.active.set()
        done = threading.Event()

        def poll() -> None:
            self._poll()
            done.set()

        self._put(poll)
        done.wait(timeout=30)

    def _poll(self) -> None:
        started = next(self._clock)
        ops: dict[str, str] = {}
        parent_op: str | None = None
        for run in self._search():
            tags = run.data.tags
            op = tags.get(OP_TAG)
            if op is None:  # an empty op is answered (an error) and removed like any other
                continue
            if tags.get(ROLE_TAG) == "run":
                ops[tags.get(RUN_TAG, "")] = op
                self._seen[tags.get(RUN_TAG, "")] = run.info.run_id
            elif run.info.run_id == self.parent_run_id:
                parent_op = op
        if parent_op is not None:
            ops[""] = parent_op
        with self._lock:
            # A marker is done once this poll no longer sees its text, or began after our delete
            # completed: what it sees was set after that delete, a new op even if the same text.
            self._consumed = {
                n: c for n, c in self._consumed.items()
                if ops.get(n) == c.op and (c.done_at is None or c.done_at > started)
            }
            # The parent run's op, unless a poll before this one answered it.
            unanswered = (parent_op if parent_op is not None
                          and not self._is_consumed("", parent_op) else None)
            if unanswered is not None:
                self._consumed[""] = _Consumed(unanswered)
            ops.pop("", None)
            self._ops = ops
            names = sorted(self._runs, key=lambda n: (len(n), n))
        if unanswered is not None:
            # The engine only knows the RF runs: an op on the experiment's parent run would
            # wait forever. Answer it here, on this thread, as the engine answers a bad op.
            listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            self._answer("", self.parent_run_id, unanswered, (
                f"error: {unanswered!r} was set on the experiment's parent run, which no op "
                f"applies to: set {OP_TAG} on one of its child runs (run name, also its tag "
                f"{RUN_TAG}: {listed or 'none yet'})"))

    # ------------------------------------------------------------------ the thread

    def _ensure_thread(self) -> None:
        """The background thread, (re)started if :meth:`suspend` stopped it."""
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="rapidfire-tracking",
                                                daemon=True)
                self._thread.start()

    def _put(self, job: Callable[[], None]) -> None:
        self._ensure_thread()
        self._jobs.put(job)

    def suspend(self) -> None:
        """Write what is queued and stop the background thread until the next write, poll or
        :meth:`resume` (between ``train()`` calls: a notebook that trains many experiments
        keeps no idle thread, and nothing of them, alive)."""
        self.flush()
        with self._thread_lock:
            if self._thread is not None and self._thread.is_alive():
                self._stop.set()
                self._jobs.put(lambda: None)
                self._thread.join(timeout=30)

    def resume(self) -> None:
        """Start the background thread again (a ``train()`` call begins)."""
        self._ensure_thread()

    def _loop(self) -> None:
        next_poll = next_write = next_beat = 0.0
        while True:
            timeout = max(min(next_poll, next_write, next_beat) - time.monotonic(), 0.0)
            try:
                job = self._jobs.get(timeout=timeout)
            except queue.Empty:
                job = None
            if job is not None:
                self._run_job(job)
                if self._stop.is_set() and self._jobs.empty():
                    return
                continue
            if self._stop.is_set():
                return
            now = time.monotonic()
            if now >= next_write:
                self._write_pending()
                next_write = time.monotonic() + self.write_interval
            if now >= next_poll:
                if self.polling.is_set():
                    self._run_job(self._poll)
                next_poll = time.monotonic() + self.poll_interval
            if now >= next_beat:
                if self._beating:
                    self._run_job(self._beat)
                next_beat = time.monotonic() + HEARTBEAT_INTERVAL

    def _run_job(self, job: Callable[[], None]) -> None:
        self.active.wait()
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            self._errors.append(f"{type(exc).__name__}: {exc}")

    @property
    def errors(self) -> list[str]:
        """Errors MLflow raised on the background thread (training went on)."""
        return list(self._errors)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued write is done."""
        self.active.set()
        done = threading.Event()

        def write() -> None:
            self._write_pending()
            done.set()

        self._put(write)
        done.wait(timeout=timeout)

    def close(self, parent_status: str | None = "FINISHED") -> None:
        """Flush, end the parent run, stop the thread."""
        if parent_status is not None:
            self._jobs.put(lambda: self.client.set_terminated(self.parent_run_id, parent_status))
        self.flush()
        self.suspend()
