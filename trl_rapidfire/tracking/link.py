"""The tracker's link to MLflow, made on the tracking thread, never on the way to training.

Opening it costs seconds: MLflow's import (~1 s), a new sqlite store's schema (~2 s), the
experiment and the experiment's parent run found or created. :class:`Link` makes it on the
tracking thread, the first thing that thread does (issue 46: the first chunk must not wait for
it), and keeps it; what needs it asks :meth:`Link.get` on that thread. A failure is kept and
noted once: one that no retry mends (a half-created store holding data,
:class:`TrackingStoreError`) for good, any other (a server not up yet) tried again at the next
need, at most every ``retry_after`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..storage.names import is_run_name
from .mlflow_store import TrackingStoreError, ensure_schema
from .tags import EXPERIMENT_TAG, ROLE_TAG, RUN_TAG

__all__ = ["Connection", "Link", "open_connection", "search_runs"]

# The most runs one search may return (a poll, a batch's lookup): MLflow's own page maximum.
SEARCH_MAX = 5000


@dataclass(frozen=True)
class Connection:
    """What every MLflow call of the tracker needs, once made."""

    client: Any  # an MlflowClient
    experiment_id: str
    parent_run_id: str
    rf_experiment: str  # our experiment id (the ``rapidfire.experiment`` tag of every run)

    def search(self, extra: str = "", max_results: int = SEARCH_MAX) -> Sequence[Any]:
        """The experiment's runs (ours: tagged with its id) matching ``extra``."""
        return search_runs(self.client, self.experiment_id, self.rf_experiment, extra,
                           max_results)


def search_runs(client: Any, experiment_id: str, rf_experiment: str, extra: str = "",
                max_results: int = SEARCH_MAX) -> Sequence[Any]:
    flt = f"tags.`{EXPERIMENT_TAG}` = '{rf_experiment}'" + extra
    return client.search_runs([experiment_id], filter_string=flt, max_results=max_results)


def open_connection(uri: str, experiment_name: str, rf_experiment: str,
                    setup_lock: Any) -> Connection:
    """MLflow imported, the store's schema made (or repaired), the experiment and its parent
    run found or created: under ``setup_lock``, so that the workers of a launch that start
    together create each once."""
    from mlflow import MlflowClient

    ensure_schema(uri)
    client = MlflowClient(uri)
    with setup_lock:
        exp = client.get_experiment_by_name(experiment_name)
        experiment_id = (exp.experiment_id if exp is not None
                         else client.create_experiment(experiment_name))
        found = search_runs(client, experiment_id, rf_experiment,
                            f" and tags.`{ROLE_TAG}` = 'experiment'")
        parent = next((r.info.run_id for r in found if r.data.tags.get(RUN_TAG, "") == ""),
                      None)
        if parent is None:
            parent = client.create_run(
                experiment_id,
                tags={EXPERIMENT_TAG: rf_experiment, ROLE_TAG: "experiment", RUN_TAG: ""},
                run_name=f"{experiment_name} ({rf_experiment[:8]})").info.run_id
    return Connection(client, experiment_id, parent, rf_experiment)


def run_filter(name: str) -> str:
    """The filter that finds child run ``name`` by its tag. Only our ``run-<n>`` names go into
    a filter (other text could change the query): for any other name the filter is empty and
    the caller matches the name among what it finds."""
    return f" and tags.`{RUN_TAG}` = '{name}'" if is_run_name(name) else ""


class Link:
    """The connection, made once by ``make`` on the tracking thread.

    Args:
        make: opens the connection (:func:`open_connection`, bound).
        note_error: where a failure is reported (each distinct message once).
        retry_after: seconds before a failed attempt is tried again.
    """

    def __init__(self, make: Callable[[], Connection], note_error: Callable[[str], None],
                 retry_after: float) -> None:
        self._make = make
        self._note_error = note_error
        self._retry_after = retry_after
        self._connection: Connection | None = None
        self._failure: BaseException | None = None
        self._failed_at = -float("inf")
        self._noted: set[str] = set()
        self.started = False  # an attempt has begun

    @property
    def connection(self) -> Connection | None:
        """The connection if it is made (any thread; never waits)."""
        return self._connection

    @property
    def failure(self) -> BaseException | None:
        """Why the last attempt failed (``None``: made, or not tried yet)."""
        return self._failure

    @property
    def retry_after(self) -> float:
        """Seconds between two attempts (of the store, or of a run MLflow refused)."""
        return self._retry_after

    @property
    def tried(self) -> bool:
        """An attempt has ended (the store is open, or the failure is kept)."""
        return self._connection is not None or self._failure is not None

    def get(self) -> Connection | None:
        """The connection, made now if need be (on the tracking thread only); ``None`` while
        it cannot be (the failure is noted)."""
        if self._connection is not None:
            return self._connection
        if isinstance(self._failure, TrackingStoreError):
            return None  # a person has to act on the store first: no retry mends it
        if time.monotonic() - self._failed_at < self._retry_after:
            return None
        self.started = True
        try:
            self._connection = self._make()
            self._failure = None
        except Exception as exc:  # noqa: BLE001 - kept and noted: tracking never stops training
            self._failure, self._failed_at = exc, time.monotonic()
            text = f"{type(exc).__name__}: {exc}"
            if text not in self._noted:
                self._noted.add(text)
                self._note_error(text)
        return self._connection

    def attempt(self) -> None:
        """:meth:`get` as a job of the thread (its answer is read from :attr:`connection`)."""
        self.get()

    def error(self) -> TrackingStoreError:
        """What a caller that needs the connection, and cannot have it, raises."""
        failure = self._failure
        if isinstance(failure, TrackingStoreError):
            return failure
        if failure is None:
            return TrackingStoreError("the MLflow store was not opened in time (the tracking "
                                      "thread is busy or stopped)")
        return TrackingStoreError(f"the MLflow store could not be opened: "
                                  f"{type(failure).__name__}: {failure}")
