"""What the Tracker reads from the store does not grow with the number of runs where it need
not: registering a run finds it by its name (not by reading every run of the experiment), and
a poll of the control tags reads the runs that carry an op (not every run with its whole
config). Before, both read all N runs: registering 200 runs took 0.47 s a run and one poll
(every second, while training) 1.2 s (benchmarks/tracking_scale.py measures it).

Runs are registered in batches on the tracking thread: a batch reads the whole experiment in
one search only when the experiment holds about as many runs as the batch (a new experiment, a
re-run registering everything), else it looks each run up by its name.

The store is real (sqlite); the client's ``search_runs`` is only watched: each call's filter
and how many runs it returned are recorded, then the real answer goes back."""

from __future__ import annotations

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

from trl_rapidfire.tracking.tags import OP_TAG
from trl_rapidfire.tracking.tracker import Tracker


def _watched(tracker: Tracker) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []
    search = tracker.client.search_runs

    def watching(*args, **kwargs):
        found = search(*args, **kwargs)
        calls.append((kwargs.get("filter_string", ""), len(found)))
        return found

    tracker.client.search_runs = watching
    return calls


def _register(tracker: Tracker, names: list[str]) -> None:
    """Register ``names`` as one batch: the tracking thread's jobs wait while they are queued
    (as while the engine switches runs), then all are made."""
    tracker.active.clear()
    for name in names:
        tracker.ensure_run(name, {"learning_rate": name}, {})
    tracker.active.set()
    tracker.flush()


def test_registering_and_polling_read_the_runs_they_need_only(tmp_path):
    tracker = Tracker(tmp_path / "exp", uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    names = [f"run-{i}" for i in range(12)]
    try:
        tracker.polling.clear()  # only the polls asked for below
        calls = _watched(tracker)
        # A batch on an experiment that holds about as many runs: one search finds them all
        # (here none: all are created).
        _register(tracker, names)
        assert calls == [(calls[0][0], 0)] and "rapidfire.run" not in calls[0][0], calls
        ids = [tracker.run_id(name) for name in names]
        calls.clear()
        _register(tracker, names)  # registered again: one search finds all 12
        assert [found for _, found in calls] == [12], calls
        assert [tracker.run_id(name) for name in names] == ids
        # One more run, when the experiment holds many: looked up by its name, not by reading
        # every run of the experiment (which made registering N runs cost O(N^2)).
        calls.clear()
        _register(tracker, ["run-12"])
        assert len(calls) == 1 and "`rapidfire.run` = 'run-12'" in calls[0][0], calls
        assert calls[0][1] == 0

        tracker.client.set_tag(tracker.run_id("run-7"), OP_TAG, "stop")
        calls.clear()
        tracker.poll_now()
        assert tracker.pending_ops() == {"run-7": "stop"}
        assert [found for _, found in calls] == [1] and "IS NOT NULL" in calls[0][0]
    finally:
        tracker.close()

    # A re-run registering its runs at once finds them with one search, ids unchanged.
    again = Tracker(tmp_path / "exp", uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        again.polling.clear()
        calls = _watched(again)
        _register(again, names)
        assert [found for _, found in calls] == [13], calls  # capped at 2 x 12 + 1: all
        assert [again.run_id(name) for name in names] == ids
    finally:
        again.close()


def test_a_store_that_cannot_filter_on_a_tags_presence_is_read_whole(tmp_path):
    """A tracking server older than ``IS NOT NULL`` on tags refuses that filter: the poll says
    so once, then reads every run of the experiment and finds the ops among them."""
    tracker = Tracker(tmp_path / "exp", uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        for i in range(3):
            tracker.ensure_run(f"run-{i}", {}, {})
        tracker.client.set_tag(tracker.run_id("run-2"), OP_TAG, "resume")
        search, filters = tracker.client.search_runs, []

        def down(*args, **kwargs):
            raise MlflowException("store down", error_code=INTERNAL_ERROR)

        # Another error is the poll's own, as before (the tracking thread notes it) ...
        tracker.client.search_runs = down
        tracker.poll_now()
        assert any("store down" in error for error in tracker.errors), tracker.errors

        def old_server(*args, **kwargs):
            filters.append(kwargs.get("filter_string", ""))
            if "IS NOT NULL" in filters[-1]:  # as an older server answers it
                raise MlflowException("Invalid comparator 'IS NOT NULL'",
                                      error_code=INVALID_PARAMETER_VALUE)
            return search(*args, **kwargs)

        # ... but this one says the filter is unknown: once, then every run is read.
        tracker.client.search_runs = old_server
        tracker.poll_now()
        tracker.poll_now()
        assert tracker.pending_ops() == {"run-2": "resume"}
        assert ["IS NOT NULL" in f for f in filters] == [True, False, False]
    finally:
        tracker.client.search_runs = search
        tracker.close()
