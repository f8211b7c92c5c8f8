"""An experiment read back from the folder it left behind: its runs with their metric
histories, the chunk schedule and the op log.

Everything comes from ``schedule.csv``, ``ops.csv``, ``.rapidfire/scheduler.json``, the MLflow
store or the Trainer's ``trainer_state.json`` files, never from a live trainer, so a finished
experiment, a running one or one copied from another machine reads alike. Files are only ever
parsed as CSV or JSON, and nothing is written (not even a missing MLflow store).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..control.folder_control import alive
from ..shared_state.runs import shown_status
from ..shared_state.state_file import FileStore
from ..shared_state.store import StoreError
from ..storage.csv_logs import read_rows, utc_seconds
from ..storage.layout import Layout, run_order
from ..storage.names import UntrustedValue, is_run_name
from ..storage.outside_text import STATE_BYTES
from ..storage.own_files import read_json
from ..storage.schedule import ChunkRecord, read_schedule_csv
from ..tracking.tags import EXPERIMENT_TAG, ROLE_TAG, RUN_TAG, STATUS_TAG, resolve_tracking_uri
from .results import metric_points

__all__ = [
    "TRAIN_METRIC",
    "ExperimentData",
    "OpEvent",
    "RunData",
    "load_experiment",
    "read_ops",
    "run_order",
    "split_metrics",
]

TRAIN_METRIC = "loss"
"""The key the Trainer logs the training loss under."""

_STEP_IN_RESULT = re.compile(r"\bat step (\d+)")
_CREATED = re.compile(r"\bcreated (\S+)")
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_HEX_ID = re.compile(r"[0-9a-fA-F]{1,64}")


@dataclass(frozen=True)
class OpEvent:
    """One row of ``<output_dir>/ops.csv``: an op as the experiment handled it.

    Attributes:
        time: when it was applied (``time.time()``).
        source: ``tag``, ``python`` or ``policy:<Name>``.
        run: the run it targeted (for a clone: the parent).
        op: the op text (``stop``, ``clone-warm {...}``, ...).
        result: ``ok: ...``, ``error: ...`` or ``skipped: ...``.
    """

    time: float
    source: str
    run: str
    op: str
    result: str

    @property
    def verb(self) -> str:
        return self.op.strip().partition(" ")[0].lower()

    @property
    def applied(self) -> bool:
        return self.result.startswith("ok")

    @property
    def by_policy(self) -> bool:
        return self.source.startswith("policy")

    @property
    def step(self) -> int | None:
        """The run's step as the result text states it (``stopped at step 16``), if it does."""
        match = _STEP_IN_RESULT.search(self.result)
        return int(match.group(1)) if match else None


@dataclass
class RunData:
    """What the report knows about one run.

    Attributes:
        name: ``run-<index>``.
        status: from the shared scheduler state (or the MLflow status tag), ``None`` if unknown.
        steps: optimizer steps done, ``None`` if unknown.
        knobs: the run's knob values as the scheduler state keeps them (JSON).
        history: metric key -> ``[(step, value), ...]`` sorted by step, one value per step.
        source: where ``history`` came from: ``mlflow``, ``disk`` or ``""`` (nowhere).
    """

    name: str
    status: str | None = None
    steps: int | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    source: str = ""

    def latest(self, key: str) -> float | None:
        """The value at the run's highest logged step of ``key`` (``None`` if never finite)."""
        points = [v for _, v in self.history.get(key, []) if math.isfinite(v)]
        return points[-1] if points else None


@dataclass
class ExperimentData:
    """An experiment read back from its folder (see :func:`load_experiment`).

    Attributes:
        output_dir: the experiment's ``output_dir``.
        name: a display name (the MLflow experiment's when tracked, else the folder's).
        runs: run name -> :class:`RunData`, in run order.
        schedule: the finished chunks (``schedule.csv``).
        ops: the op log (``ops.csv``), in the order handled.
        source: ``mlflow`` when MLflow held the runs' metrics, else ``disk``.
        source_detail: one sentence on where the metrics came from (and why not MLflow).
        search: an adaptive search's log (``search.csv``): what it proposed and was told.
    """

    output_dir: Path
    name: str
    runs: dict[str, RunData]
    schedule: list[ChunkRecord]
    ops: list[OpEvent]
    source: str
    source_detail: str
    search: list[SearchEvent] = field(default_factory=list)


# ----------------------------------------------------------------------------- reading


def _read_json(path: Path) -> Any:
    try:
        return read_json(path, max_bytes=STATE_BYTES)
    except (OSError, ValueError):  # missing, a link, too large or deep, not JSON
        return None


def read_ops(path: str | os.PathLike) -> list[OpEvent]:
    """The op log at ``path`` (``<output_dir>/ops.csv``), in the order handled; rows cut short
    by a crash are skipped. Times are ISO-8601 text, or floats in a log written before."""
    out = []
    for row in read_rows(path):
        try:
            out.append(OpEvent(utc_seconds(row["time"]), row["source"] or "", row["run"] or "",
                               row["op"] or "", row["result"] or ""))
        except (KeyError, TypeError, ValueError):
            continue  # a line cut short by a crash
    return out


@dataclass(frozen=True)
class SearchEvent:
    """One row of an adaptive search's log: ``proposed`` (``detail``: the sampler's params as
    JSON), ``told`` (the trial's state and value) or ``not told`` (why)."""

    time: float
    event: str
    run: str
    trial: str
    detail: str


def read_search_log(path: str | os.PathLike) -> list[SearchEvent]:
    """The search log at ``path`` (``<output_dir>/search.csv``), oldest first; rows cut
    short by a crash are skipped."""
    out = []
    for row in read_rows(path):
        try:
            out.append(SearchEvent(float(row["time"]), row["event"] or "", row["run"] or "",
                                   row["trial"] or "", row["detail"] or ""))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _scheduler_runs(output_dir: Path) -> dict[str, dict[str, Any]]:
    layout = Layout(output_dir)
    try:  # the snapshot and the changes journalled since
        state = FileStore(layout.state_dir, fingerprint="", create=False).peek()
    except StoreError:
        state = None  # damaged or partial: whatever the snapshot still says
    if state is not None:
        return {n: r.to_json() for n, r in state.runs.items()}
    doc = _read_json(layout.scheduler_state)
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, dict):
        return {}
    return {str(n): r for n, r in runs.items() if isinstance(r, dict)}


def _disk_state(output_dir: Path, run: str) -> Path | None:
    layout = Layout(output_dir)
    try:  # a run name read from the folder never leads a read out of it
        final = layout.final_dir(run) / "trainer_state.json"
        folder = layout.checkpoints(run)
    except UntrustedValue:
        return None
    if final.is_file():
        return final
    best: tuple[int, Path] | None = None
    if folder.is_dir():
        for child in folder.iterdir():
            match = _CHECKPOINT.fullmatch(child.name)
            state = child / "trainer_state.json"
            if match and state.is_file() and (best is None or int(match.group(1)) > best[0]):
                best = (int(match.group(1)), state)
    return best[1] if best else None


def _disk_histories(output_dir: Path, runs: Iterable[str], keys: Sequence[str]
                    ) -> dict[str, dict[str, list[tuple[int, float]]]]:
    out = {}
    for run in runs:
        path = _disk_state(output_dir, run)
        doc = _read_json(path) if path is not None else None
        if isinstance(doc, dict):
            out[run] = metric_points(doc.get("log_history"), keys)
    return out


def _mlflow_histories(
    output_dir: Path, keys: Sequence[str], uri: str | None, experiment: str | None
) -> tuple[dict[str, dict[str, list[tuple[int, float]]]], dict[str, str], str]:
    """Histories and status tags of the experiment's MLflow child runs, and a sentence on
    where they came from or why there were none."""
    uri = uri or resolve_tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        # Opening a missing sqlite store would create it: a report must not write there.
        return {}, {}, f"no MLflow store at {uri}"
    marker = _read_json(Layout(output_dir).experiment_marker)
    rf_id = marker.get("id") if isinstance(marker, dict) else None
    # The id goes into a search filter: only the hex ids the tracker writes are accepted.
    if not isinstance(rf_id, str) or not _HEX_ID.fullmatch(rf_id):
        return {}, {}, f"{output_dir} was never tracked with MLflow (no experiment id)"
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or output_dir.resolve().name
    try:
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(name)
        if exp is None:
            return {}, {}, f"no MLflow experiment named {name!r} in {uri}"
        found = client.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.`{ROLE_TAG}` = 'run' and tags.`{EXPERIMENT_TAG}` = '{rf_id}'",
            max_results=5000,
        )
        histories: dict[str, dict[str, list[tuple[int, float]]]] = {}
        statuses: dict[str, str] = {}
        for mlflow_run in found:
            run = mlflow_run.data.tags.get(RUN_TAG)
            if not run:
                continue
            if STATUS_TAG in mlflow_run.data.tags:
                statuses[run] = mlflow_run.data.tags[STATUS_TAG]
            series = {}
            for key in keys:
                if key not in mlflow_run.data.metrics:
                    continue
                points = sorted(client.get_metric_history(mlflow_run.info.run_id, key),
                                key=lambda m: (m.step, m.timestamp))
                series[key] = sorted({m.step: float(m.value) for m in points}.items())
            histories[run] = series
    except Exception as err:  # noqa: BLE001 - a report still draws from the files on disk
        return {}, {}, f"MLflow at {uri} could not be read ({type(err).__name__}: {err})"
    if not histories:
        return {}, {}, f"MLflow experiment {name!r} in {uri} holds no runs of {output_dir}"
    return histories, statuses, f"MLflow ({uri}, experiment {name!r})"


def split_metrics(metric: str) -> list[str]:
    """The metrics named in ``metric``: one, or two separated by a comma (``eval_loss,
    accuracy``: a report's two objectives).

    Raises:
        ValueError: none, or more than two."""
    names = [name.strip() for name in metric.split(",")]
    if not 1 <= len(names) <= 2 or not all(names):
        raise ValueError(f"a metric, or two separated by a comma, not {metric[:80]!r}")
    return names


def load_experiment(
    output_dir: str | os.PathLike,
    *,
    metric: str = "eval_loss",
    tracking_uri: str | None = None,
    experiment: str | None = None,
) -> ExperimentData:
    """Read an experiment back from its ``output_dir``.

    Metrics come from the MLflow store when it holds the experiment's runs (``tracking_uri``
    defaults to ``MLFLOW_TRACKING_URI`` or ``./mlflow.db``; ``experiment`` to
    ``MLFLOW_EXPERIMENT_NAME`` or the base name of ``output_dir``, as when tracking), else from
    each run's ``runs/<run>/final/trainer_state.json`` or its latest boundary checkpoint's.
    Only the training ``loss`` and ``metric`` (or ``eval_<metric>``) are read; two metrics
    (``eval_loss,accuracy``) read both.

    Raises:
        LookupError: ``output_dir`` holds no trl-rapidfire experiment.
    """
    root = Path(output_dir)
    known = [root / "schedule.csv", root / "ops.csv", root / ".rapidfire", root / "runs"]
    if not root.is_dir() or not any(p.exists() for p in known):
        raise LookupError(f"{root} holds no trl-rapidfire experiment (no schedule.csv, ops.csv "
                          "or .rapidfire folder)")
    schedule = read_schedule_csv(root / "schedule.csv") if (
        root / "schedule.csv").is_file() else []
    ops = sorted(read_ops(root / "ops.csv"), key=lambda o: o.time)
    state = _scheduler_runs(root)
    # A run in the rotation of an experiment no process trains now reads "interrupted".
    training = alive(Layout(root)) is not None

    keys = [TRAIN_METRIC]
    for name in split_metrics(metric):
        keys += [name] if name.startswith("eval_") else [name, f"eval_{name}"]
    keys = list(dict.fromkeys(keys))
    tracked, tags, detail = _mlflow_histories(root, keys, tracking_uri, experiment)

    names = set(state) | {c.run for c in schedule} | set(tracked)
    names |= {m.group(1) for o in ops if o.applied and (m := _CREATED.search(o.result))}
    for folder in (root / "runs", root / ".rapidfire" / "checkpoints"):
        if folder.is_dir():
            names |= {p.name for p in folder.iterdir() if p.is_dir()}
    # Names come from files, folders and tags others may write: only run names are read.
    names = {n for n in names if is_run_name(n)}
    on_disk = _disk_histories(root, sorted(names - set(tracked)), keys)

    runs = {}
    for name in sorted(names, key=run_order):
        rec = state.get(name, {})
        mine = [c for c in schedule if c.run == name]
        history = tracked.get(name, on_disk.get(name, {}))
        steps = rec.get("global_step")
        if not isinstance(steps, int):
            logged = [s for series in history.values() for s, _ in series]
            steps = max([c.end_step for c in mine] + logged, default=None)
        status = rec.get("status") if isinstance(rec.get("status"), str) else tags.get(name)
        if status is not None:
            status = shown_status(status, training=training)
        knobs = rec.get("knobs")
        if not isinstance(knobs, dict):
            knobs = {}
        source = "mlflow" if name in tracked else "disk" if name in on_disk else ""
        runs[name] = RunData(name, status, steps, dict(knobs), history, source)

    if tracked:
        source = "mlflow"
        missing = [n for n, r in runs.items() if r.source != "mlflow"]
        if missing:
            detail += f"; not in MLflow, from disk: {', '.join(missing)}"
    else:
        source = "disk"
        detail = f"Trainer log histories on disk (trainer_state.json); {detail}"
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or root.resolve().name
    return ExperimentData(root, name, runs, schedule, ops, source, detail,
                          read_search_log(root / "search.csv"))
