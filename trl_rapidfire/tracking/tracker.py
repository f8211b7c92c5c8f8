"""MLflow tracking: one parent run per experiment, one child run per RF run, and run tags as the
control channel.

Everything that talks to MLflow runs on one background thread, never on the training path:
constructing the tracker and registering runs only queue work (issue 46: at 64 configs, opening
the store and creating the runs took ~5 s before the first chunk could start), and the engine
*enqueues* (a chunk's metric points after the chunk ends, tag updates, run ends) and reads the
latest polled control tags from memory. The thread's first job opens MLflow (:mod:`.link`:
import, schema, experiment, parent run); then it creates the registered runs in batches, in the
order registered (:mod:`.registration`), writes what is queued every two seconds in as few
calls as it can and, about once a second, polls the control tags of the whole experiment with a
single query. A run's points, tags and end wait in memory until its MLflow run exists.

Where: ``MLFLOW_TRACKING_URI`` if set, else a sqlite store ``mlflow.db`` in the working
directory (MLflow's own default, made explicit); a URI MLflow would refuse is refused at
construction (:mod:`.store_uri`). Which experiment: ``MLFLOW_EXPERIMENT_NAME`` if set, else
the base name of ``output_dir``. Runs are found by the tag ``rapidfire.experiment`` (an id kept
in ``<output_dir>/.rapidfire/experiment.json``) plus the run name, so two output folders with
the same base name never mix, and a re-run of the same script on the same folder continues the
same MLflow runs.

The tracker is the face the engine sees; the parts are :mod:`.background` (the thread),
:mod:`.link` (the store opened), :mod:`.registration` (runs found or created),
:mod:`.writes` (each run's queued points, tags and MLflow status, written per run),
:mod:`.op_channel` (ops set as run tags, and their answers) and :mod:`.mlflow_store` (a store
left half-created by a crash, repaired).
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
import weakref
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from .background import BackgroundThread, Periodic
from .link import Connection, Link, open_connection
from .mlflow_store import TrackingStoreError
from .op_channel import OpChannel
from .registration import Registrar
from .store_uri import check_mlflow_installed, check_tracking_uri
from .tags import (
    EXPERIMENT_TAG,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_STALE,
    HEARTBEAT_TAG,
    OP_RESULT_TAG,
    OP_SEQ_TAG,
    OP_TAG,
    PROCESS_TAG,
    ROLE_TAG,
    RUN_TAG,
    STATUS_TAG,
    experiment_id_for,
    mlflow_status_of,
    resolve_tracking_uri,
)
from .writes import ENDED, Point, RunWrites

# The tag names stay importable from here (tracking_tags.py holds them for readers).
__all__ = [
    "EXPERIMENT_TAG",
    "OP_RESULT_TAG",
    "OP_SEQ_TAG",
    "OP_TAG",
    "HEARTBEAT_STALE",
    "HEARTBEAT_TAG",
    "ROLE_TAG",
    "RUN_TAG",
    "STATUS_TAG",
    "Tracker",
    "TrackingStoreError",
    "experiment_id_for",
    "resolve_tracking_uri",
]

# How a train() call ended -> the parent run's MLflow status.
_EXPERIMENT_STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
# At interpreter exit, how long a tracker may still take to open the store and create the runs
# it was given (a script that never trains must not leave a half-made schema behind).
_EXIT_WAIT = 30.0


class Tracker:
    """The experiment's MLflow runs and the background thread that talks to MLflow.

    Args:
        output_dir: the experiment folder (its base name names the MLflow experiment).
        uri: tracking URI (default :func:`resolve_tracking_uri`).
        experiment_name: default ``MLFLOW_EXPERIMENT_NAME`` or the base name of ``output_dir``.
        poll_interval: seconds between two polls of the control tags.
        write_interval: seconds between two writes of queued points and tags.

    Raises:
        RFConfigError: MLflow is not installed, or it would refuse ``uri`` (checked without
            importing it: the store itself is opened on the tracking thread).
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
        self.uri = uri or resolve_tracking_uri()
        check_mlflow_installed()
        check_tracking_uri(self.uri)
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
        self.polling = threading.Event()  # set while an experiment trains
        self._beating = False  # between experiment_started() and experiment_ended()
        self.polling.set()
        # Writes queued points and tags every write_interval s, polls the control tags every
        # poll_interval s while polling is set, beats while an experiment trains.
        self._thread = BackgroundThread("rapidfire-tracking", [
            Periodic(write_interval, self._write_pending),
            Periodic(poll_interval, self._poll, self.polling.is_set),
            Periodic(HEARTBEAT_INTERVAL, self._beat, lambda: self._beating),
        ])
        # Cleared while the engine switches runs (see BackgroundThread).
        self.active = self._thread.active
        self.ops = OpChannel(self._thread.note_error)
        self._filter_ops = True  # the store filters the runs that carry an op (see _poll)
        self._link = Link(self._open, self._thread.note_error,
                          retry_after=max(write_interval, 1.0))
        self._runs = Registrar(self._link, self._thread, self._setup_lock,
                               self._thread.note_error)
        self._writes = RunWrites(self._runs, self._link, self._thread)
        _LIVE.add(self)
        # The thread starts with the first thing asked of it (a registration, a flush, a
        # train() call) and opens the store first. Not now: in a training process the first
        # run is built next, importing modules MLflow imports too (IPython: transformers'
        # notebook callback on this side, MLflow's REST client on the thread's), and one thread
        # importing a submodule while another finishes its package can fail in CPython's import
        # machinery (seen: the first run's build failed with ``KeyError: 'IPython'`` 1 time in
        # 5 against a server; 0 in 8 once the thread started at the first registration).

    def _open(self) -> Connection:
        conn = open_connection(self.uri, self.experiment_name, self.rf_experiment,
                               self._setup_lock)
        self.ops.bind(conn.client, conn.parent_run_id)
        return conn

    # ------------------------------------------------------------------ the store, once open

    def _connection(self, timeout: float = 60.0) -> Connection:
        """The open store, waited for (or asked for) off the tracking thread."""
        conn = self._link.connection
        if conn is None:
            if self._thread.is_current():
                conn = self._link.get()
            else:
                self._thread.run_and_wait(self._link.attempt, timeout)
                conn = self._link.connection
        if conn is None:
            raise self._link.error()
        return conn

    @property
    def client(self) -> Any:
        """The ``MlflowClient`` (waits until the tracking thread has opened the store)."""
        return self._connection().client

    @property
    def experiment_id(self) -> str:
        """The MLflow experiment's id (waits until the store is open)."""
        return self._connection().experiment_id

    @property
    def parent_run_id(self) -> str:
        """The experiment's parent run (waits until the store is open)."""
        return self._connection().parent_run_id

    # ------------------------------------------------------------------ runs

    def ensure_run(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> None:
        """Queue RF run ``name``'s MLflow run: found (a re-run) or created with ``params`` and
        ``tags`` by the tracking thread, in the order registered. Returns at once; points,
        tags and the end queued for the run meanwhile wait for it. Params are logged once
        (MLflow forbids changing them); on a re-run only the missing ones are added."""
        self._runs.add(name, params, tags)

    def run_id(self, name: str, timeout: float = 60.0) -> str:
        """The MLflow run id of RF run ``name``, its creation waited for (or done now).

        Raises:
            KeyError: ``name`` was never registered.
            TrackingStoreError: its MLflow run could not be made (the reason).
        """
        if not self._runs.known(name):
            raise KeyError(name)
        if self._runs.handle(name) is None:
            if self._thread.is_current():
                self._runs.register_all()
            else:
                self._thread.run_and_wait(self._runs.register_all, timeout)
        handle = self._runs.handle(name)
        if handle is None:
            if self._link.connection is None:
                raise self._link.error()
            raise TrackingStoreError(f"the MLflow run of {name} was not made in time; the "
                                     f"last refusal: {self._runs.last_refusal or 'none'}")
        return handle.run_id

    # ------------------------------------------------------------------ queued writes

    def log_metrics(self, name: str, points: list[Point]) -> None:
        """Queue ``(key, value, step, timestamp_ms)`` points of run ``name``.

        Points and tags go out together every ``write_interval`` seconds (or at :meth:`flush`):
        one write for many chunks keeps MLflow's cost off the training thread. A point at a
        step the store has for that key (a re-run retraining) is skipped.
        """
        self._writes.log_metrics(name, points)

    def set_tags(self, name: str, tags: Mapping[str, str]) -> None:
        """Queue tag updates of run ``name``; the latest value of each tag is written with the
        next batch."""
        self._writes.set_tags(name, tags)

    def delete_tag(self, name: str, key: str) -> None:
        """Queue the removal of tag ``key`` from run ``name`` (none there: nothing to do)."""
        self._writes.set_tags(name, {key: None})

    def end_run(self, name: str, status: str) -> None:
        """Queue the end of run ``name`` with the MLflow status matching RF ``status`` (after
        its last points and tags)."""
        mlflow_status = mlflow_status_of(status)
        if mlflow_status in ENDED:
            self._writes.set_status(name, mlflow_status)

    def mark_scheduled(self, name: str) -> None:
        """Run ``name`` is left pending when a ``train()`` call ends: MLflow's ``SCHEDULED``
        (waiting for its first chunk), not the ``RUNNING`` MLflow makes every run with. Its
        first chunk, in a later call, makes it ``RUNNING`` (its status tag). A name never
        registered here is left alone."""
        if self._runs.known(name):
            self._writes.set_status(name, "SCHEDULED")

    def _write_pending(self) -> None:
        # A method of its own: the write every write_interval s (benchmarks time it by name).
        self._writes.write_pending()

    def _drain(self) -> None:
        """Every registered run made, then every queued write done (on the thread)."""
        self._runs.register_all()
        self._write_pending()

    # ------------------------------------------------------------------ the experiment

    def experiment_started(self) -> None:
        """A ``train()`` call begins: the parent run is (again) running, with a heartbeat
        from now on, so a re-run reopens what the last call ended."""
        def job() -> None:
            conn = self._link.get()
            if conn is not None:
                conn.client.update_run(conn.parent_run_id, status="RUNNING")
                conn.client.set_tag(conn.parent_run_id, PROCESS_TAG,
                                    f"{socket.gethostname()}:{os.getpid()}")
                self._beat()

        self._beating = True
        self._thread.put(job)

    def experiment_ended(self, outcome: str) -> None:
        """A ``train()`` call ended (``finished``, ``failed`` or ``killed``): the parent run
        ends with that status, after what is queued before it."""
        self._beating = False
        self._thread.put(partial(self._end_parent, _EXPERIMENT_STATUS[outcome]))

    def _end_parent(self, status: str) -> None:
        self._drain()
        conn = self._link.get()
        if conn is not None:
            conn.client.set_terminated(conn.parent_run_id, status)

    def _beat(self) -> None:
        conn = self._link.get()
        if conn is not None:
            conn.client.set_tag(conn.parent_run_id, HEARTBEAT_TAG, str(int(time.time())))

    # ------------------------------------------------------------------ control tags

    def pending_ops(self) -> dict[str, str]:
        """Run name -> the op text set on it and not yet consumed (latest poll)."""
        return self.ops.pending()

    def consume_op(self, name: str, op: str, result: str) -> None:
        """The engine applied (or rejected) ``op``: remove the tag, then write the result."""
        # A run this process never set up (e.g. a name no run has) is answered too.
        if not self._runs.known(name) and self.ops.seen_run_id(name) is None:
            return
        self.ops.consumed(name, op)
        # An older result queued for this run (a policy's) must not land after this answer.
        self._writes.drop_tag(name, OP_RESULT_TAG)
        self._thread.put(partial(self._answer, name, op, result))

    def _answer(self, name: str, op: str, result: str) -> None:
        # An older result held back since consume_op (its run not made yet).
        self._writes.drop_tag(name, OP_RESULT_TAG)
        if self._runs.waiting(name):
            self._runs.register_all()  # its MLflow run first: the answer goes on it
        handle = self._runs.handle(name)
        run_id = handle.run_id if handle is not None else self.ops.seen_run_id(name)
        if run_id is not None:
            self.ops.answer(name, run_id, op, result)

    def poll_now(self) -> None:
        """Poll the control tags synchronously (tests; the thread polls on its own)."""
        self._thread.run_and_wait(self._poll, timeout=30)

    def _poll(self) -> None:
        conn = self._link.get()
        if conn is not None:  # before the store is open, no op can have been set
            self.ops.poll(partial(self._runs_with_ops, conn), self._runs.names)

    def _runs_with_ops(self, conn: Connection) -> list[Any]:
        """The experiment's runs that carry an op tag now: the store filters them, so a poll
        (every second, while training) reads the few runs a person steers, not all N runs with
        their whole configs (at 500 runs that search alone took seconds). A server too old
        for ``IS NOT NULL`` on tags says so once; from then on every run is read and filtered
        in :meth:`OpChannel.poll`."""
        from mlflow.exceptions import MlflowException

        if self._filter_ops:
            try:
                return list(conn.search(f" and tags.`{OP_TAG}` IS NOT NULL"))
            except MlflowException as err:
                if err.error_code != "INVALID_PARAMETER_VALUE":
                    raise
                self._filter_ops = False
        return list(conn.search())

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
        """Wait until every registered run is in MLflow and every queued write is done."""
        self._thread.run_and_wait(self._drain, timeout=timeout)

    def close(self, parent_status: str | None = "FINISHED") -> None:
        """Flush, end the parent run, stop the thread."""
        if parent_status is not None:
            self._thread.put(partial(self._end_parent, parent_status))
        self.flush()
        self.suspend()

    def _settle_at_exit(self) -> None:
        """The store opened and the registered runs made, if that is still under way."""
        if self._runs.pending or (self._link.started and not self._link.tried):
            self._thread.run_and_wait(self._register_all_opened, timeout=_EXIT_WAIT)

    def _register_all_opened(self) -> None:
        if self._link.get() is not None:
            self._runs.register_all()


# Trackers whose thread may still be opening the store or creating runs when the interpreter
# exits (their thread is a daemon: cut short, it could leave a half-made schema).
_LIVE: weakref.WeakSet[Tracker] = weakref.WeakSet()


@atexit.register
def _settle_at_exit() -> None:
    for tracker in list(_LIVE):
        tracker._settle_at_exit()  # noqa: SLF001 - the module's own exit hook
