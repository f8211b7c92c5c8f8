"""The trl-rapidfire experiments in an MLflow store, as the CLI and :mod:`.control` see them
from outside the training process: which one an op or a status query is for.

Each experiment is a parent run (tag ``rapidfire.role`` = ``experiment``) whose MLflow status
says how its last ``train()`` call ended, and whose tag ``rapidfire.heartbeat`` the training
process refreshes while it trains (:mod:`.tracking`). An experiment is *training* when its
parent run is running with a fresh heartbeat. With no experiment named, ops go to the one
experiment that is training; none or several is an error that lists them, never a guess.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..storage.layout import Layout, run_order
from ..tracking.tags import read_experiment_id
from .tracked_runs import RunCatalog, TrackedRun, open_catalog, sqlite_path

__all__ = ["Experiment", "KnobColumns", "experiment_runs", "experiment_state", "find_experiment",
           "gone_here", "knob_columns", "list_experiments", "tracked_knobs"]

_LISTED = 5  # experiments named in a message
# The knob columns of a status table: a few, each value cut, so that a line stays readable
# with a LoRA config's description for a value (--full: every knob, values whole).
KNOB_COLUMNS = 6
KNOB_CHARS = 30


@dataclass(frozen=True)
class Experiment:
    """An experiment found in an MLflow store.

    Attributes:
        uri, experiment_id: the store and the MLflow experiment.
        rf_experiment: trl-rapidfire's id of the experiment (``<output_dir>/.rapidfire/``).
        parent_run_id: the experiment's parent run.
        name: the MLflow experiment's name.
        state: ``training``, ``finished``, ``failed``, ``killed``, or ``not responding`` (its
            process stopped answering: killed outright, or its machine lost).
        last_seen: Unix time of its last heartbeat (``None`` before heartbeats existed).
        process_gone: the process that trained it last ran on this machine and has ended
            (so its next ``train()`` is another process's, which has only what is on disk).
    """

    uri: str
    experiment_id: str
    rf_experiment: str
    parent_run_id: str
    name: str
    state: str = "finished"
    last_seen: float | None = None
    process_gone: bool = False

    @property
    def training(self) -> bool:
        """Whether its training process is running now (an op is applied soon)."""
        return self.state == "training"

    def describe(self) -> str:
        """``'demo' (1a2b3c4d, training)``: enough to tell experiments apart."""
        return f"{self.name!r} ({self.rf_experiment[:8]}, {self.state})"


def _state(run: TrackedRun, now: float) -> tuple[str, float | None]:
    return experiment_state(run.status, run.tags, now)


def experiment_state(status: str, tags: Mapping[str, str], now: float | None = None
                     ) -> tuple[str, float | None]:
    """What an experiment's parent run (its MLflow ``status`` and ``tags``) says of it, as
    every view on this machine shows it (the CLI, the dashboard's panel): ``training``,
    ``finished``, ``failed``, ``killed`` or ``not responding``; and its last heartbeat. A
    process on this machine that is gone is said at once (killed outright: its heartbeat would
    take minutes to age, and MLflow keeps it RUNNING)."""
    from ..tracking.tags import HEARTBEAT_STALE, HEARTBEAT_TAG

    now = time.time() if now is None else now
    beat = tags.get(HEARTBEAT_TAG, "")
    seen = float(beat) if re.fullmatch(r"\d+(\.\d+)?", beat) else None
    if status == "RUNNING":
        fresh = seen is not None and now - seen <= HEARTBEAT_STALE
        return ("training" if fresh and not gone_here(tags) else "not responding"), seen
    return {"FINISHED": "finished", "FAILED": "failed"}.get(status, "killed"), seen


def gone_here(tags: Mapping[str, str]) -> bool:
    """Whether the process that trains a parent run with ``tags`` (its ``host:pid`` tag) was
    on this machine and is gone."""
    from ..tracking.tags import PROCESS_TAG

    found = re.fullmatch(r"([A-Za-z0-9._-]{1,253}):(\d{1,10})", tags.get(PROCESS_TAG, ""))
    if found is None or found.group(1) != socket.gethostname():
        return False
    try:
        os.kill(int(found.group(2)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        return False  # alive (another user's), or not a pid this system has
    return False


def _catalog(uri: str | None) -> RunCatalog:
    from ..tracking.tags import resolve_tracking_uri

    uri = uri or resolve_tracking_uri()
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        raise LookupError(f"no MLflow store at {uri} ({path} does not exist); set "
                          "MLFLOW_TRACKING_URI or --uri, or run from the folder that holds "
                          "mlflow.db")
    return open_catalog(uri)


def _rf_id_of(output_dir: str | os.PathLike) -> str:
    layout = Layout(output_dir)
    marker = layout.experiment_marker
    if not marker.is_file():
        if layout.scheduler_state.is_file():
            raise LookupError(
                f"{output_dir} holds an experiment that is not tracked in MLflow (its config "
                "has report_to without \"mlflow\"): reach it through its folder "
                "(the CLI with --dir, or trl_rapidfire.client.send.send_op(..., output_dir=...)), "
                "or from its script (trainer.stop('run-1'), ...)."
            )
        raise LookupError(f"{output_dir} holds no trl-rapidfire experiment ({marker} is "
                          "missing)")
    try:
        return read_experiment_id(marker)
    except ValueError as err:
        raise LookupError(f"{err}; restore it, or reach the experiment by its MLflow name "
                          "(--experiment)") from None


def list_experiments(
    *, output_dir: str | os.PathLike | None = None, experiment: str | None = None,
    uri: str | None = None,
) -> list[Experiment]:
    """The experiments in the store (of ``output_dir``, or of the MLflow experiment named
    ``experiment``, when given), newest first.

    Raises:
        LookupError: no store, an ``output_dir`` holding no tracked experiment, or no MLflow
            experiment of that name.
    """
    from ..tracking.tags import EXPERIMENT_TAG, ROLE_TAG

    wanted = {ROLE_TAG: "experiment"}
    if output_dir is not None:
        wanted[EXPERIMENT_TAG] = _rf_id_of(output_dir)
    catalog = _catalog(uri)
    names = catalog.experiment_names()
    if experiment is not None:
        experiment_id = catalog.experiment_id(experiment)
        if experiment_id is None:
            raise LookupError(f"no MLflow experiment named {experiment!r} in {catalog.uri}")
        names = {experiment_id: experiment}
    runs = catalog.runs(list(names), wanted)
    now = time.time()
    found = []
    for run in runs:
        state, seen = _state(run, now)
        found.append(Experiment(catalog.uri, run.experiment_id, run.tags[EXPERIMENT_TAG],
                                run.run_id, names[run.experiment_id], state, seen,
                                process_gone=gone_here(run.tags)))
    return found


def _listed(experiments: list[Experiment]) -> str:
    shown = ", ".join(e.describe() for e in experiments[:_LISTED])
    more = len(experiments) - _LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def find_experiment(
    *, output_dir: str | os.PathLike | None = None, experiment: str | None = None,
    uri: str | None = None, latest_if_none_training: bool = True,
) -> Experiment:
    """The experiment a command is for.

    By its ``output_dir`` or MLflow experiment name (the one of that name that is training,
    else its latest). With neither: the one experiment that is training in the store; if
    none is, the latest one (or, with ``latest_if_none_training=False``, an error naming
    them); if several are, an error naming them.

    Raises:
        LookupError: nothing matches, or which one is meant is unclear (the message lists the
            candidates and the options that choose one).
    """
    found = list_experiments(output_dir=output_dir, experiment=experiment, uri=uri)
    store = uri or (found[0].uri if found else "the store")
    if not found:
        raise LookupError(f"no trl-rapidfire experiment found in {store}")
    training = [e for e in found if e.training]
    if output_dir is not None or experiment is not None:
        return training[0] if training else found[0]
    choose = "choose one with --experiment NAME or --output-dir DIR"
    if len(training) > 1:
        raise LookupError(f"{len(training)} experiments are training in {found[0].uri}: "
                          f"{_listed(training)}; {choose}")
    if training:
        return training[0]
    if latest_if_none_training:
        return found[0]
    raise LookupError(f"no experiment is training in {found[0].uri} (the latest: "
                      f"{_listed(found)}); {choose}")


def experiment_runs(exp: Experiment) -> list[TrackedRun]:
    """The MLflow runs of ``exp``'s RF runs, in run order."""
    from ..tracking.tags import EXPERIMENT_TAG, ROLE_TAG, RUN_TAG

    runs = open_catalog(exp.uri).runs([exp.experiment_id],
                                      {ROLE_TAG: "run", EXPERIMENT_TAG: exp.rf_experiment})
    return sorted(runs, key=lambda run: run_order(run.tags.get(RUN_TAG, "")))


@dataclass(frozen=True)
class KnobColumns:
    """The knobs a status table shows: ``names`` (its column headers), ``cells`` (one list per
    run, in the runs' order) and ``hidden`` (knobs that differ too but did not fit)."""

    names: list[str]
    cells: list[list[str]]
    hidden: int = 0


def tracked_knobs(params: Sequence[Mapping[str, str]], tags: Sequence[Mapping[str, str]]
                  ) -> tuple[list[dict[str, str]], list[str] | None]:
    """Each tracked run's knob values, from its MLflow params and tags, and what
    :func:`knob_columns` needs to find the knobs among them: ``(rows, run_names)``.

    A run's ``rapidfire.knobs`` tag names its knobs (a JSON list): where every run has one,
    the rows hold those params alone and ``run_names`` is ``None``. Runs tracked before that
    tag (or with a tag that does not read as a list of names: it is text from outside) give
    their whole config, sorted, with their names, so that params holding a run's own name
    (``output_dir``) are left out."""
    from ..storage.outside_text import loads
    from ..tracking.tags import KNOBS_TAG, RUN_TAG

    rows: list[dict[str, str]] = []
    for run_params, run_tags in zip(params, tags):
        try:  # bounded in size and depth: a tag of 5000 "[" is a RecursionError to json
            names = loads(run_tags.get(KNOBS_TAG) or "null", what=f"the {KNOBS_TAG} tag",
                          max_bytes=8000)
        except ValueError:  # cut at its length limit, too deep, or not ours
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            break
        rows.append({n: run_params[n] for n in names if n in run_params})
    else:
        return rows, None
    return ([dict(sorted(p.items())) for p in params],
            [t.get(RUN_TAG, "") for t in tags])


def knob_columns(knobs: Sequence[Mapping[str, Any]], run_names: Sequence[str] | None = None,
                 *, full: bool = False) -> KnobColumns:
    """The knobs whose values differ between the runs (``knobs``: each run's knob values: the
    shared state's, or its MLflow params), as table columns in first-seen order: at most
    :data:`KNOB_COLUMNS`, values cut to :data:`KNOB_CHARS` (``full``: all, whole). What all
    runs share says nothing about any one of them. A knob whose values are config objects
    (a ``LoraConfig``) is shown by its fields (``peft_config.lora_alpha``:
    :func:`~trl_rapidfire.reports.knob_fields.expand_knobs`). With ``run_names`` (MLflow
    params: the whole config), a param whose value holds the run's own name (its
    ``output_dir``) differs too but is no knob: left out."""
    from ..reports.display import clip, differing_keys
    from ..reports.knob_fields import expand_knobs
    from ..reports.report import format_value

    knobs = expand_knobs(knobs)  # a LoRA config's fields, each a column: the one that differs
    found = [(key, [format_value(run.get(key)) for run in knobs])
             for key in differing_keys(knobs, run_names)]
    shown = found if full else found[:KNOB_COLUMNS]
    cells = [[values[i] if full else clip(values[i], KNOB_CHARS) for _, values in shown]
             for i in range(len(knobs))]
    return KnobColumns([key for key, _ in shown], cells, len(found) - len(shown))
