"""Run tags as the control channel (docs/ic-ops.md): which ops are set, and answering one.

A person (or the CLI, or a button) sets ``rapidfire.op`` on a run. Polls read every run's tags
in one query; the engine takes the ops not yet consumed. Once it applied one, the tag is
removed if it still holds that text (compare-and-delete), and only then are
``rapidfire.op.result`` and ``rapidfire.op.seq`` written: a person who waits for either
before setting the next op never loses it. Until a poll that began after that delete, the
same text still seen on the run is the consumed op, not a new one.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .tags import OP_RESULT_TAG, OP_SEQ_TAG, OP_TAG, ROLE_TAG, RUN_TAG

__all__ = ["OpChannel"]


@dataclass
class _Consumed:
    """An applied op whose tag polls may still show, until a poll that began after our
    compare-and-delete completed (``done_at``, the channel's clock): the same text is then a
    new op."""

    op: str
    done_at: int | None = None


class OpChannel:
    """The ops set on the experiment's runs, as of the latest poll, and their answers.

    Args:
        note_error: where an error that leaves an op tag in place is reported.

    The MLflow client and the experiment's parent run (an op set there is answered with an
    error: no op applies to it) are given by :meth:`bind` once the tracking thread has opened
    the store; until then nothing is polled or answered, and no op is pending.
    """

    def __init__(self, note_error: Callable[[str], None]) -> None:
        self._client: Any = None
        self._parent_run_id = ""
        self._note_error = note_error
        self._lock = threading.Lock()
        self._ops: dict[str, str] = {}
        self._seen: dict[str, str] = {}  # run name -> MLflow run id, of every polled child run
        self._consumed: dict[str, _Consumed] = {}
        self._clock = itertools.count(1)  # orders polls and deletes (next() is atomic)

    def bind(self, client: Any, parent_run_id: str) -> None:
        """The store is open: its client, and the experiment's parent run."""
        self._client, self._parent_run_id = client, parent_run_id

    def pending(self) -> dict[str, str]:
        """Run name -> the op text set on it and not yet consumed (latest poll)."""
        with self._lock:
            return {n: op for n, op in self._ops.items() if not self._is_consumed(n, op)}

    def seen_run_id(self, name: str) -> str | None:
        """The MLflow run id of the child run ``name`` as polls saw it (``None``: never seen)."""
        return self._seen.get(name)

    def consumed(self, name: str, op: str) -> None:
        """The engine took ``op`` of run ``name``: no longer pending (its answer follows)."""
        with self._lock:
            self._consumed[name] = _Consumed(op)

    def answer(self, name: str, run_id: str, op: str, result: str) -> None:
        """Compare-and-delete the op tag first, then write the result and the answer count: a
        person sets the next op once this one's tag is gone (or its answer is there), when the
        delete is done and cannot remove it. Another text found there was set over this op
        before its answer (against the protocol) and stays pending. (On the tracking thread.)"""
        from mlflow.entities import RunTag

        tags = self._client.get_run(run_id).data.tags
        removed = True
        if tags.get(OP_TAG) == op:
            try:
                self._client.delete_tag(run_id, OP_TAG)
            except Exception as exc:  # noqa: BLE001 - gone meanwhile is fine; else say so
                removed = self._client.get_run(run_id).data.tags.get(OP_TAG) != op
                if not removed:  # the tag stays filtered: the op was applied once
                    self._note_error(f"removing {name}'s op tag: {type(exc).__name__}: {exc}")
        done = next(self._clock)
        with self._lock:
            marker = self._consumed.get(name)
            if removed and marker is not None and marker.op == op:
                marker.done_at = done
        count = tags.get(OP_SEQ_TAG, "0")
        seq = int(count) + 1 if count.isdigit() else 1  # one consumer: no lost increments
        self._client.log_batch(run_id, tags=[RunTag(OP_RESULT_TAG, result[:5000]),
                                             RunTag(OP_SEQ_TAG, str(seq))])

    def poll(self, search: Callable[[], Sequence[Any]], run_names: Callable[[], list[str]]
             ) -> None:
        """Read the ops set on the experiment's runs (``search``: its runs, in one query) and
        answer one set on the parent run. (On the tracking thread.)"""
        started = next(self._clock)
        ops: dict[str, str] = {}
        parent_op: str | None = None
        for run in search():
            tags = run.data.tags
            op = tags.get(OP_TAG)
            if op is None:  # an empty op is answered (an error) and removed like any other
                continue
            if tags.get(ROLE_TAG) == "run":
                ops[tags.get(RUN_TAG, "")] = op
                self._seen[tags.get(RUN_TAG, "")] = run.info.run_id
            elif run.info.run_id == self._parent_run_id:
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
        if unanswered is not None:
            # The engine only knows the RF runs: an op on the experiment's parent run would
            # wait forever. Answer it here, on this thread, as the engine answers a bad op.
            names = sorted(run_names(), key=lambda n: (len(n), n))
            listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            self.answer("", self._parent_run_id, unanswered, (
                f"error: {unanswered!r} was set on the experiment's parent run, which no op "
                f"applies to: set {OP_TAG} on one of its child runs (run name, also its tag "
                f"{RUN_TAG}: {listed or 'none yet'})"))

    def _is_consumed(self, name: str, op: str) -> bool:
        return name in self._consumed and self._consumed[name].op == op
