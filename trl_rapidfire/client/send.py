"""Sending ops from another process: the CLI's and a person's Python calls.

An op is checked here as every sender checks it (its syntax; whether the run's status rules it
out), then delivered: as the run's ``rapidfire.op`` tag on the experiment's tracking server, or
as a file in the inbox of an experiment MLflow does not track. The training process applies it
at its next chunk boundary and answers in the same place. The op language itself:
:mod:`trl_rapidfire.control.ops.ops`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..control.folder_control import Inbox, alive, folder_runs, is_untracked
from ..control.ops import Op, parse_op
from .experiments import Experiment, experiment_runs, find_experiment

__all__ = [
    "Delivery",
    "Experiment",
    "check_op",
    "clone",
    "delete",
    "deliver_op",
    "experiment_runs",
    "find_experiment",
    "replaced_warning",
    "resume",
    "send_op",
    "stop",
]


@dataclass(frozen=True)
class Delivery:
    """Where a sent op went.

    Attributes:
        target: the experiment, as a person tells it apart (``'demo' (1a2b3c4d, training)``,
            or its folder for an experiment MLflow does not track).
        training: whether a training process will apply it at its next chunk boundary (else
            at the script's next ``train()``).
        run_id: the MLflow run tagged; ``None`` for an untracked experiment (the op is a file
            in its inbox, :mod:`.folder_control`).
        replaced: the op that was waiting on the run, not answered yet, which this one
            replaced (a run has one op tag: the experiment never sees the one replaced).
    """

    target: str
    training: bool
    run_id: str | None = None
    replaced: str | None = None


def check_op(run: str, op: str, status: str | None = None) -> Op:
    """``op`` for ``run`` as every sender checks it before sending: its syntax (raises
    :class:`OpError`) and, when the run's ``status`` is known, whether that status rules it out
    (stopping a completed run, resuming a running one: raises ``LookupError``)."""
    from ..shared_state.runs import RunStatus, status_op_refusal

    parsed = parse_op(op)
    if status in {s.value for s in RunStatus} and not parsed.is_clone:
        refusal = status_op_refusal(run, RunStatus(status), parsed.verb)
        if refusal is not None:
            raise LookupError(refusal)
    return parsed


def send_op(run: str, op: str, *, next_run: bool = False, **where: Any) -> str | None:
    """Send ``op`` to ``run`` (see :func:`deliver_op`); returns the MLflow run id it was set
    on (``None`` for an untracked experiment). Warns when it replaced an op not yet applied."""
    sent = deliver_op(run, op, next_run=next_run, **where)
    if sent.replaced is not None:
        warnings.warn(replaced_warning(run, sent.replaced, op), RuntimeWarning, stacklevel=2)
    return sent.run_id


def replaced_warning(run: str, replaced: str, op: str) -> str:
    """What a sender is told when its op replaced one the experiment had not answered."""
    return (f"{run} had the op {replaced!r} waiting, not applied yet; {op!r} replaced it, so "
            f"{replaced!r} will not be applied. A run holds one op at a time: send the next "
            "once the last is answered (its rapidfire.op.result, or trl-rapidfire status).")


def _not_training(what: str, op: str) -> LookupError:
    return LookupError(
        f"{what} is not training, so nothing would apply {op!r} until its script runs again: "
        "re-run the script first, or add --next-run (Python: next_run=True) to leave the op "
        "for its next train()")


def deliver_op(run: str, op: str, *, next_run: bool = False, **where: Any) -> Delivery:
    """Send ``op`` to ``run``, checked first (:func:`check_op`).

    ``where``: ``output_dir=``, ``experiment=`` and/or ``uri=`` as for :func:`find_experiment`;
    with none of them, the experiment that is training in the store. A tracked experiment gets
    the op as the run's tag ``rapidfire.op``, as from the MLflow UI; one MLflow does not track
    (an ``output_dir`` with ``report_to="none"``) as a file in its inbox. The training process
    applies it at its next chunk boundary and answers it.

    Refused (``LookupError``, with the reason) when the experiment is not training, unless
    ``next_run`` (the op then waits for its script's next ``train()``), when there is no such
    run, and when the run's status rules the op out.
    """
    check_op(run, op)  # a typo is said first, before any store is opened
    output_dir = where.get("output_dir")
    if output_dir is not None and is_untracked(output_dir):
        return _deliver_to_folder(run, op, output_dir, next_run)
    from ..tracking.tags import OP_TAG, RUN_TAG, STATUS_TAG
    from .tracked_runs import open_catalog

    exp = find_experiment(**where, latest_if_none_training=next_run)
    if not exp.training and not next_run:
        raise _not_training(f"experiment {exp.describe()}", op)
    runs = experiment_runs(exp)
    for tracked in runs:
        if tracked.tags.get(RUN_TAG) != run:
            continue
        try:
            check_op(run, op, tracked.tags.get(STATUS_TAG))
        except LookupError as err:
            raise LookupError(f"{err} (experiment {exp.describe()})") from None
        waiting = tracked.tags.get(OP_TAG) or None
        open_catalog(exp.uri).set_tag(tracked.run_id, OP_TAG, op)
        return Delivery(f"experiment {exp.describe()}", exp.training, tracked.run_id,
                        replaced=waiting)
    if exp.training and output_dir is not None:
        # A training experiment makes its runs' MLflow runs in the background as it starts
        # (the first chunk does not wait for them): a run its folder already has gets the op
        # through the folder's inbox, which the experiment reads at every chunk boundary too.
        posted = _post_before_registration(run, op, output_dir)
        if posted is not None:
            return Delivery(f"experiment {exp.describe()} (through {output_dir}: its MLflow "
                            "run is not made yet)", True)
    names = [r.tags.get(RUN_TAG) for r in runs]
    later = (" (the experiment is starting and registers its runs in MLflow in the "
             "background: if it has that run, try again in a moment, or name its folder with "
             "--dir / output_dir= to send the op there now)"
             if exp.training and output_dir is None else "")
    raise LookupError(f"no run named {run!r} in experiment {exp.name!r}; runs: {names}{later}")


def _post_before_registration(run: str, op: str, output_dir: str | os.PathLike
                              ) -> os.PathLike | None:
    """Leave ``op`` in the inbox of the tracked experiment in ``output_dir`` when its shared
    state has ``run`` (checked against the run's status there first); ``None`` when it has
    no such run."""
    from ..storage.layout import Layout

    if _checked_in_folder(run, op, output_dir) is not None:
        return None
    return Inbox(Layout(output_dir)).post(run, op)


def _checked_in_folder(run: str, op: str, output_dir: str | os.PathLike) -> list[str] | None:
    """``op`` checked against ``run``'s status in the shared state of ``output_dir``
    (``LookupError`` when the status rules it out); ``None`` when the run is there, else
    the names of the runs that are."""
    runs = {r.name: r for r in folder_runs(output_dir)}
    if run not in runs:
        return sorted(runs)
    check_op(run, op, runs[run].status)
    return None


def _deliver_to_folder(run: str, op: str, output_dir: str | os.PathLike, next_run: bool
                       ) -> Delivery:
    from ..storage.layout import Layout

    others = _checked_in_folder(run, op, output_dir)
    if others is not None:
        raise LookupError(f"no run named {run!r} in {output_dir}; runs: {others}")
    layout = Layout(output_dir)
    training = alive(layout) is not None
    if not training and not next_run:
        raise _not_training(f"the experiment in {output_dir}", op)
    Inbox(layout).post(run, op)
    return Delivery(f"{output_dir} (not tracked in MLflow)", training)


def stop(run: str, **where: Any) -> str | None:
    """Ask the experiment to stop ``run`` (see :func:`send_op`)."""
    return send_op(run, "stop", **where)


def resume(run: str, **where: Any) -> str | None:
    """Ask the experiment to resume the stopped ``run``."""
    return send_op(run, "resume", **where)


def delete(run: str, **where: Any) -> str | None:
    """Ask the experiment to delete ``run`` for good."""
    return send_op(run, "delete", **where)


def clone(run: str, overrides: Mapping[str, Any] | None = None, *, warm: bool = False,
          **where: Any) -> str | None:
    """Ask the experiment to clone ``run`` with ``overrides`` (warm-started with ``warm``)."""
    verb = "clone-warm" if warm else "clone"
    return send_op(run, f"{verb} {json.dumps(dict(overrides or {}))}", **where)
