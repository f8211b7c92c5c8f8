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
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

__all__ = [
    "OP_RESULT_TAG",
    "OP_TAG",
    "Tracker",
    "experiment_id_for",
    "resolve_tracking_uri",
]

OP_TAG = "rapidfire.op"
OP_RESULT_TAG = "rapidfire.op.result"
RUN_TAG = "rapidfire.run"
EXPERIMENT_TAG = "rapidfire.experiment"
STATUS_TAG = "rapidfire.status"
PROGRESS_TAG = "rapidfire.progress"
ROLE_TAG = "rapidfire.role"

_MLFLOW_STATUS = {"completed": "FINISHED", "failed": "FAILED", "stopped": "KILLED",
                  "deleted": "KILLED"}
_PARAM_VALUE_MAX = 6000


def resolve_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def experiment_id_for(output_dir: str | os.PathLike) -> str:
    """The experiment's id, created once and kept in ``<output_dir>/.rapidfire/``."""
    path = Path(output_dir) / ".rapidfire" / "experiment.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))["id"]
    path.parent.mkdir(parents=True, exist_ok=True)
    value = uuid.uuid4().hex
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"id": value}), encoding="utf-8")
    os.replace(tmp, path)
    return json.loads(path.read_text(encoding="utf-8"))["id"]


def _ensure_schema(uri: str) -> None:
    # Several processes creating a new sqlite store at once crash MLflow ("table already
    # exists"): create the schema once, under a lock beside the database file.
    from mlflow import MlflowClient

    if uri.startswith("sqlite:///"):
        from filelock import FileLock

        db = Path(uri[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(db) + ".lock"):
            MlflowClient(uri).search_experiments(max_results=1)
    else:
        MlflowClient(uri).search_experiments(max_results=1)


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
        _ensure_schema(self.uri)
        self.client = MlflowClient(self.uri)
        with self._setup_lock:
            exp = self.client.get_experiment_by_name(self.experiment_name)
            self.experiment_id = (
                exp.experiment_id if exp is not None
                else self.client.create_experiment(self.experiment_name)
            )
        self._runs: dict[str, _RunHandle] = {}
        self._ops: dict[str, str] = {}
        self._consumed: dict[str, str] = {}
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._errors: list[str] = []
        self._stop = threading.Event()
        self.polling = threading.Event()  # set while an experiment trains
        self.polling.set()
        # Cleared while the engine switches runs: MLflow calls are milliseconds of Python under
        # the GIL, so the thread waits for the next chunk, when torch kernels release the GIL.
        self.active = threading.Event()
        self.active.set()
        with self._setup_lock:
            self.parent_run_id = self._find_or_create("", role="experiment")
        self._thread = threading.Thread(target=self._loop, name="rapidfire-tracking",
                                        daemon=True)
        self._thread.start()

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
        run = self.client.create_run(
            self.experiment_id, tags=all_tags,
            run_name=name or f"{self.experiment_name} ({self.rf_experiment[:8]})",
        )
        return run.info.run_id

    def ensure_run(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        """The MLflow run of RF run ``name``: found (a re-run) or created with ``params``.

        Called while setting up, before training: synchronous. Params are logged once (MLflow
        forbids changing them); on a re-run only the missing ones are added.
        """
        from mlflow.entities import Param

        with self._setup_lock:
            run_id = self._find_or_create(name, role="run", tags=tags)
        run = self.client.get_run(run_id)
        have = run.data.params
        new = [Param(k[:250], _param_value(v)) for k, v in params.items() if k[:250] not in have]
        for i in range(0, len(new), 100):
            self.client.log_batch(run_id, params=new[i:i + 100])
        steps = {key: {m.step for m in self.client.get_metric_history(run_id, key)}
                 for key in run.data.metrics}
        self.client.set_tag(run_id, STATUS_TAG, tags.get(STATUS_TAG, "pending"))
        with self._lock:
            self._runs[name] = _RunHandle(run_id, steps)
        return run_id

    def run_id(self, name: str) -> str:
        return self._runs[name].run_id

    # ------------------------------------------------------------------ queued writes

    def log_metrics(self, name: str, points: list[tuple[str, float, int, int]]) -> None:
        """Queue ``(key, value, step, timestamp_ms)`` points of run ``name``.

        Points and tags wait in memory and go out together every ``write_interval`` seconds
        (or at :meth:`flush`): one write for many chunks keeps MLflow's cost away from the
        training thread. A point at a step the store already has for that key (a re-run
        retraining what it logged before) is skipped: one point per step per metric.
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

            self._jobs.put(job)

    # ------------------------------------------------------------------ control tags

    def pending_ops(self) -> dict[str, str]:
        """Run name -> the op text set on it and not yet consumed (latest poll)."""
        with self._lock:
            return {n: op for n, op in self._ops.items() if self._consumed.get(n) != op}

    def consume_op(self, name: str, op: str, result: str) -> None:
        """The engine applied (or rejected) ``op``: remove the tag, write the result tag."""
        with self._lock:
            self._consumed[name] = op
        handle = self._runs[name]

        def job() -> None:
            self.client.set_tag(handle.run_id, OP_RESULT_TAG, result[:5000])
            # Remove the tag only if it still holds this op: a person may have set the next
            # one since (the queue runs behind the training), and that one must stay pending.
            if self.client.get_run(handle.run_id).data.tags.get(OP_TAG) == op:
                try:
                    self.client.delete_tag(handle.run_id, OP_TAG)
                except Exception:  # noqa: BLE001 - removed meanwhile
                    pass

        self._jobs.put(job)

    def poll_now(self) -> None:
        """Poll the control tags synchronously (tests; the thread polls on its own)."""
        self.active.set()
        done = threading.Event()
        self._jobs.put(lambda: (self._poll(), done.set()))
        done.wait(timeout=30)

    def _poll(self) -> None:
        ops: dict[str, str] = {}
        for run in self._search(f" and tags.`{ROLE_TAG}` = 'run'"):
            op = run.data.tags.get(OP_TAG)
            if op:
                ops[run.data.tags.get(RUN_TAG, "")] = op
        with self._lock:
            self._ops = ops
            # A consumed op whose tag is gone may be set again later: forget it.
            self._consumed = {n: op for n, op in self._consumed.items() if ops.get(n) == op}

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        next_poll = next_write = 0.0
        while True:
            timeout = max(min(next_poll, next_write) - time.monotonic(), 0.0)
            try:
                job = self._jobs.get(timeout=timeout)
            except queue.Empty:
                job = None
            if job is not None:
                self._run_job(job)
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
        self._jobs.put(lambda: (self._write_pending(), done.set()))
        done.wait(timeout=timeout)

    def close(self, parent_status: str | None = "FINISHED") -> None:
        """Flush, end the parent run, stop the thread."""
        if parent_status is not None:
            self._jobs.put(lambda: self.client.set_terminated(self.parent_run_id, parent_status))
        self.flush()
        self._stop.set()
        self._jobs.put(lambda: None)
        self._thread.join(timeout=30)
