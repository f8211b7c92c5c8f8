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

The tracker is the face the engine sees; the parts are :mod:`.background` (the thread),
:mod:`.op_channel` (ops set as run tags, and their answers) and :mod:`.mlflow_store` (a store
left half-created by a crash, repaired).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..storage.names import is_run_name
from .background import BackgroundThread, Periodic
from .mlflow_store import TrackingStoreError, ensure_schema
from .op_channel import OpChannel
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
        self._lock = threading.Lock()  # the runs and the queued points and tags
        self.polling = threading.Event()  # set while an experiment trains
        self._beating = False  # between experiment_started() and experiment_ended()
        self.polling.set()
        with self._setup_lock:
            self.parent_run_id = self._find_or_create("", role="experiment")
        # Writes queued points and tags every write_interval s, polls the control tags every
        # poll_interval s while polling is set, beats while an experiment trains.
        self._thread = BackgroundThread("rapidfire-tracking", [
            Periodic(write_interval, self._write_pending),
            Periodic(poll_interval, self._poll, self.polling.is_set),
            Periodic(HEARTBEAT_INTERVAL, self._beat, lambda: self._beating),
        ])
        # Cleared while the engine switches runs (see BackgroundThread).
        self.active = self._thread.active
        self.ops = OpChannel(self.client, self.parent_run_id, self._thread.note_error)
        self._filter_ops = True  # the store filters the runs that carry an op (see _poll)
        self._thread.start()

    # ------------------------------------------------------------------ runs

    def _search(self, extra: str = "") -> list[Any]:
        flt = f"tags.`{EXPERIMENT_TAG}` = '{self.rf_experiment}'" + extra
        return self.client.search_runs([self.experiment_id], filter_string=flt, max_results=5000)

    def _find_or_create(self, name: str, *, role: str, tags: Mapping[str, str] | None = None
                        ) -> str:
        # Searched by the run's own name (the store matches it): a search for every run of the
        # experiment, filtered here, made registering N runs cost O(N^2) (1.5 s a run at 500).
        # Only our run-<n> names go into the filter; any other is matched here.
        by_name = f" and tags.`{RUN_TAG}` = '{name}'" if is_run_name(name) else ""
        found = self._search(f" and tags.`{ROLE_TAG}` = '{role}'{by_name}")
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
            # One job per run: a run MLflow refuses does not keep the others' points out.
            self._thread.run_guarded(partial(self._write_run, name, points.get(name, []),
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

            self._thread.put(job)

    # ------------------------------------------------------------------ the experiment

    def experiment_started(self) -> None:
        """A ``train()`` call begins: the parent run is (again) running, with a heartbeat
        from now on, so a re-run reopens what the last call ended."""
        def job() -> None:
            self.client.update_run(self.parent_run_id, status="RUNNING")
            self._beat()

        self._beating = True
        self._thread.put(job)

    def experiment_ended(self, outcome: str) -> None:
        """A ``train()`` call ended (``finished``, ``failed`` or ``killed``): the parent run
        ends with that status, after what is queued before it."""
        self._beating = False
        status = _EXPERIMENT_STATUS[outcome]

        def job() -> None:
            self._write_pending()
            self.client.set_terminated(self.parent_run_id, status)

        self._thread.put(job)

    def _beat(self) -> None:
        self.client.set_tag(self.parent_run_id, HEARTBEAT_TAG, str(int(time.time())))

    # ------------------------------------------------------------------ control tags

    def pending_ops(self) -> dict[str, str]:
        """Run name -> the op text set on it and not yet consumed (latest poll)."""
        return self.ops.pending()

    def consume_op(self, name: str, op: str, result: str) -> None:
        """The engine applied (or rejected) ``op``: remove the tag, then write the result."""
        # A run this process never set up (e.g. a name no run has) is answered too.
        run_id = self._runs[name].run_id if name in self._runs else self.ops.seen_run_id(name)
        if run_id is None:
            return
        self.ops.consumed(name, op)
        with self._lock:
            # An older result queued for this run (a policy's) must not land after this answer.
            self._pending_tags.get(name, {}).pop(OP_RESULT_TAG, None)
        self._thread.put(partial(self.ops.answer, name, run_id, op, result))

    def poll_now(self) -> None:
        """Poll the control tags synchronously (tests; the thread polls on its own)."""
        self._thread.run_and_wait(self._poll, timeout=30)

    def _poll(self) -> None:
        self.ops.poll(self._runs_with_ops, self._run_names)

    def _runs_with_ops(self) -> list[Any]:
        """The experiment's runs that carry an op tag now: the store filters them, so a poll
        (every second, while training) reads the few runs a person steers, not all N runs with
        their whole configs (at 500 runs that search alone took seconds). A server too old
        for ``IS NOT NULL`` on tags says so once; from then on every run is read and filtered
        in :meth:`OpChannel.poll`."""
        from mlflow.exceptions import MlflowException

        if self._filter_ops:
            try:
                return self._search(f" and tags.`{OP_TAG}` IS NOT NULL")
            except MlflowException as err:
                if err.error_code != "INVALID_PARAMETER_VALUE":
                    raise
                self._filter_ops = False
        return self._search()

    def _run_names(self) -> list[str]:
        with self._lock:
            return list(self._runs)

    # ------------------------------------------------------------------ the thread

    def suspend(self) -> None:
        """Write what is queued and stop the background thread until the next write, poll or
        :meth:`resume` (between ``train()`` calls: a notebook that trains many experiments
        keeps no idle thread, and nothing of them, alive)."""
        self.flush()
        self._thread.stop()

    def resume(self) -> None:
        """Start the background thread again (a ``train()`` call begins)."""
        self._thread.start()

    @property
    def errors(self) -> list[str]:
        """Errors MLflow raised on the background thread (training went on)."""
        return self._thread.errors

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued write is done."""
        self._thread.run_and_wait(self._write_pending, timeout=timeout)

    def close(self, parent_status: str | None = "FINISHED") -> None:
        """Flush, end the parent run, stop the thread."""
        if parent_status is not None:
            self._thread.put(partial(self.client.set_terminated, self.parent_run_id,
                                     parent_status))
        self.flush()
        self.suspend()
