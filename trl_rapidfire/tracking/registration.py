"""RF runs made MLflow runs, in batches, on the tracking thread (never on the way to training).

``Tracker.ensure_run`` only queues a :class:`Registration`; the thread takes the queue in
order, a batch at a time (:func:`register_batch`): under the setup file lock it finds which of
the batch's runs the experiment has (a re-run, or another worker of the launch that registered
them first), creates the others and logs the params either lacks, so every RF run has one
MLflow run whoever registers it and however often. A process killed before its batch was done
leaves some runs missing or without some params: the re-run registers every run again and
finds, creates or completes each.

Measured on a sqlite store (200 params a run): ``create_run`` ~3 ms, two ``log_batch`` of 100
params ~12 ms, a search by one run's name ~2 ms, a search reading every run of the experiment
~3 ms a run (195 ms at 64). So a batch reads the whole experiment only when it holds about as
many runs as the batch (a new store, or a re-run that registers all its runs at once: one
search instead of one per run); otherwise each run is looked up by its name.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .background import BackgroundThread
from .link import Connection, Link, run_filter
from .tags import EXPERIMENT_TAG, ROLE_TAG, RUN_TAG, STATUS_TAG

__all__ = ["BATCH", "Registrar", "Registration", "RegistrationError", "RunHandle",
           "register_batch"]

# Runs a batch holds: the setup lock is held for a batch (~20 ms a new run), so another worker
# of the launch, or the first run's points, wait at most that long for one.
BATCH = 32
_PARAM_VALUE_MAX = 6000
_PARAMS_PER_CALL = 100  # MLflow's limit on params in one log_batch
_KEY_MAX = 250  # MLflow's limit on a param key


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr, sort_keys=True)
    return text if len(text) <= _PARAM_VALUE_MAX else text[: _PARAM_VALUE_MAX - 3] + "..."


@dataclass(frozen=True)
class Registration:
    """An RF run to be found or created: its params (logged once: MLflow forbids changing
    one) and its first tags (set when its MLflow run is created)."""

    name: str
    params: Mapping[str, Any]
    tags: Mapping[str, str]

    def again(self, params: Mapping[str, Any]) -> Registration:
        """The same run registered again before it was made: the params this one lacks are
        added (a found run gets only its missing params too); its first tags stay."""
        return Registration(self.name, {**params, **self.params}, self.tags)


@dataclass
class RunHandle:
    """An RF run's MLflow run, once found or created."""

    run_id: str
    # metric key -> steps already in the store. A set, not the last step: after a crash, a
    # re-run logs the points that never reached MLflow while later steps may already be there.
    steps: dict[str, set[int]] = field(default_factory=dict)
    # Its MLflow status as the store holds it: written only when the run's status tag asks
    # for another (tracking.tags.mlflow_status_of).
    mlflow_status: str = "RUNNING"


class RegistrationError(Exception):
    """MLflow failed while a batch was registered: on run ``name`` (``None``: finding the
    batch's runs). The runs before it are registered; it and the rest are not."""

    def __init__(self, name: str | None, cause: BaseException) -> None:
        super().__init__(f"registering {name or 'runs'}: {type(cause).__name__}: {cause}")
        self.name = name


def _by_name(runs: Sequence[Any], names: set[str]) -> dict[str, Any]:
    """The first run of each name (MLflow's order: the newest first, as one search found it
    before batches)."""
    found: dict[str, Any] = {}
    for run in runs:
        name = run.data.tags.get(RUN_TAG, "")
        if name in names and name not in found:
            found[name] = run
    return found


def _existing(conn: Connection, names: list[str], known: int) -> dict[str, Any]:
    """The experiment's MLflow runs of ``names``, as the store holds them now (under the setup
    lock: nobody creates one meanwhile). ``known``: runs this tracker has found or created."""
    role = f" and tags.`{ROLE_TAG}` = 'run'"
    wanted = set(names)
    if known <= len(names):
        # Likely a new experiment or a re-run registering everything: one search, capped so
        # that a big experiment is never read whole for a small batch.
        cap = 2 * len(names) + 1
        runs = conn.search(role, max_results=cap)
        if len(runs) < cap:
            return _by_name(runs, wanted)
    found: dict[str, Any] = {}
    for name in names:
        found.update(_by_name(conn.search(role + run_filter(name)), {name}))
    return found


def _made(conn: Connection, reg: Registration, run: Any | None
          ) -> tuple[str, list[str], str]:
    """``reg``'s MLflow run, created if ``run`` is ``None``, with its missing params and a
    status tag: its id, for a found run its metric keys, and its MLflow status."""
    client = conn.client
    if run is None:
        tags = {EXPERIMENT_TAG: conn.rf_experiment, ROLE_TAG: "run", RUN_TAG: reg.name,
                "mlflow.parentRunId": conn.parent_run_id, **reg.tags}
        tags.setdefault(STATUS_TAG, "pending")
        run_id = client.create_run(conn.experiment_id, tags=tags,
                                   run_name=reg.name).info.run_id
        have_params: Mapping[str, str] = {}
        metric_keys: list[str] = []
        status = "RUNNING"  # as MLflow makes every run (a pending one too: see tags.py)
    else:
        run_id, have_params = run.info.run_id, run.data.params
        metric_keys = list(run.data.metrics)
        status = run.info.status
        # A found run's status is the engine's to change: a re-build of the same trainer (or
        # a slow worker of a launch) must not turn a completed run back to pending.
        if STATUS_TAG not in run.data.tags:
            client.set_tag(run_id, STATUS_TAG, reg.tags.get(STATUS_TAG, "pending"))
    new: dict[str, str] = {}
    for key, value in reg.params.items():
        if key[:_KEY_MAX] not in have_params:
            new.setdefault(key[:_KEY_MAX], _param_value(value))
    from mlflow.entities import Param

    params = [Param(k, v) for k, v in new.items()]
    for i in range(0, len(params), _PARAMS_PER_CALL):
        client.log_batch(run_id, params=params[i:i + _PARAMS_PER_CALL])
    return run_id, metric_keys, status


def register_batch(conn: Connection, batch: Sequence[Registration], *, lock: Any, known: int,
                   ready: Callable[[Registration, RunHandle], None]) -> None:
    """Find or create every run of ``batch``, in order; ``ready`` is told each one's handle as
    soon as it is usable. Raises :class:`RegistrationError` at the first MLflow error."""
    found: list[tuple[Registration, str, list[str], str]] = []
    # Under the lock: the workers of a launch register the same runs at the same time, and a
    # tracking server refuses a param logged twice.
    with lock:
        try:
            existing = _existing(conn, [r.name for r in batch], known)
        except Exception as exc:
            raise RegistrationError(None, exc) from exc
        for reg in batch:
            try:
                run_id, keys, status = _made(conn, reg, existing.get(reg.name))
            except Exception as exc:
                raise RegistrationError(reg.name, exc) from exc
            if reg.name in existing:
                found.append((reg, run_id, keys, status))
            else:
                ready(reg, RunHandle(run_id, mlflow_status=status))
    # Outside the lock: the steps a found run already has (a re-run skips them).
    for reg, run_id, keys, status in found:
        try:
            steps = {key: {m.step for m in conn.client.get_metric_history(run_id, key)}
                     for key in keys}
        except Exception as exc:
            raise RegistrationError(reg.name, exc) from exc
        ready(reg, RunHandle(run_id, steps, status))


class Registrar:
    """The experiment's registered runs: queued in order, made in batches on the tracking
    thread, and each one's handle once made.

    Args:
        link: the store (opened on the thread before the first batch).
        thread: the tracking thread.
        setup_lock: the file lock the workers of a launch find or create runs under.
        note_error: where a refusal is reported (each distinct one once: a run MLflow refuses
            is tried again at every write, at most every ``link.retry_after`` seconds).
    """

    def __init__(self, link: Link, thread: BackgroundThread, setup_lock: Any,
                 note_error: Callable[[str], None]) -> None:
        self._link, self._thread, self._setup_lock = link, thread, setup_lock
        self._note_error = note_error
        self._lock = threading.Lock()
        self._runs: dict[str, RunHandle] = {}  # written on the tracking thread only
        self._names: dict[str, None] = {}  # every run registered, in order
        self._queue: dict[str, Registration] = {}  # not made yet, in the order registered
        self._retry_at: dict[str, float] = {}  # a run MLflow refused: not before then
        self._queued = False  # a registration job is queued
        self._noted: set[str] = set()
        self.last_refusal = ""  # the last error a registration met

    # ---------------------------------------------------------------- any thread

    def add(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> None:
        """Queue ``name`` (again: the params its earlier registration lacks are added)."""
        with self._lock:
            self._names[name] = None
            earlier = self._queue.get(name)
            # In place: a run registered twice keeps its place in the order.
            self._queue[name] = (earlier.again(params) if earlier is not None
                                 else Registration(name, dict(params), dict(tags)))
            start, self._queued = not self._queued, True
        if start:
            self._thread.put(self.register_next)

    def handle(self, name: str) -> RunHandle | None:
        """``name``'s MLflow run, if it is made."""
        return self._runs.get(name)

    def waiting(self, name: str) -> bool:
        """Whether ``name`` is registered and its MLflow run not made yet."""
        return name in self._queue and name not in self._runs

    def known(self, name: str) -> bool:
        """Whether ``name`` was ever registered here."""
        return name in self._names

    def names(self) -> list[str]:
        with self._lock:
            return list(self._names)

    @property
    def pending(self) -> bool:
        """Some registered run is not made yet."""
        return bool(self._queue)

    # ---------------------------------------------------------------- the tracking thread

    def register_next(self) -> None:
        """A job: one batch, then another job for the next batch (other jobs, and the writes
        of the runs already made, go between two batches)."""
        again = False
        try:
            again = self._register_batch()
        finally:
            with self._lock:
                again = again and any(self._runnable(time.monotonic()))
                self._queued = again
        if again:
            self._thread.put(self.register_next)

    def register_all(self) -> None:
        """Every registered run made now (a flush, an op's answer, a caller waiting)."""
        while self._register_batch():
            pass

    def retry(self) -> None:
        """Queue a job for the runs left waiting (a refusal, the store not open yet)."""
        with self._lock:
            start = bool(self._queue) and not self._queued
            self._queued = self._queued or start
        if start:
            self._thread.put(self.register_next)

    def _runnable(self, now: float) -> Iterator[Registration]:
        return (r for r in self._queue.values() if self._retry_at.get(r.name, 0.0) <= now)

    def _register_batch(self) -> bool:
        """Register the next batch; whether it went through (more may be left)."""
        with self._lock:
            batch = list(itertools.islice(self._runnable(time.monotonic()), BATCH))
            known = len(self._runs)
        if not batch:
            return False
        conn = self._link.get()
        if conn is None:
            return False
        try:
            register_batch(conn, batch, lock=self._setup_lock, known=known,
                           ready=self._made)
        except RegistrationError as err:
            self.last_refusal = str(err)
            if self.last_refusal not in self._noted:
                self._noted.add(self.last_refusal)
                self._note_error(self.last_refusal)
            if err.name is None:
                return False  # the store itself: the next write tries again
            # That run waits a while (its points too); the others go on, in order.
            with self._lock:
                self._retry_at[err.name] = time.monotonic() + self._link.retry_after
        return True

    def _made(self, reg: Registration, handle: RunHandle) -> None:
        with self._lock:
            current = self._runs.get(reg.name)
            if current is None or current.run_id != handle.run_id:
                self._runs[reg.name] = handle
            if self._queue.get(reg.name) is reg:  # not registered again meanwhile
                del self._queue[reg.name]
                self._retry_at.pop(reg.name, None)
