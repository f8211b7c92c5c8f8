"""``trl-rapidfire status``: an experiment's runs as a table in the terminal, read from MLflow
(its runs' tags and latest metrics) or, for an experiment MLflow does not track, from its
folder. Each knob that differs has a column of its own; the trainer kind's own metric (a
reward model's accuracy, a policy's reward) one beside the losses.

The rows are best first by the experiment's ranking metric (:mod:`..reports.ranking`: the one
the policy, ``best_run``, the panels and the report use), runs without a value last;
``--sort METRIC`` sorts by another logged metric (``--sort run``: in run order), ``--top K``
keeps the first K rows."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["OP_CHARS", "ahead_of_mlflow", "show_status", "sort_order"]

OP_CHARS = 60  # an op's text is cut to this many characters, unless --full
RUN_ORDER = "run"  # --sort run: the runs in run order (run-0, run-1, ..., run-10)
_T = TypeVar("_T")


def sort_order(sort: str | None, ranking: Any, logged: Sequence[Mapping[str, Any]]) -> Any:
    """What the rows are sorted by: the experiment's ``ranking`` (a
    :class:`~..reports.ranking.RankingMetric`) without ``sort`` or when ``sort`` names its
    metric; another logged metric (lower is better for names ending in ``loss``, else
    higher); ``None`` for run order (``sort`` is ``run``).

    Raises:
        ValueError: no run logged ``sort`` (the metrics they did log are named).
    """
    from ..reports.ranking import RankingMetric

    if sort is None or sort in ranking.keys:
        return ranking
    if sort == RUN_ORDER:
        return None
    metric = RankingMetric(sort, not sort.endswith("loss"), source="--sort")
    if not any(metric.value_of(m) is not None for m in logged):
        names = sorted({k for m in logged for k in m})
        raise ValueError(f"--sort {sort[:80]}: no run logged that metric; they logged "
                         f"{', '.join(names) or 'none yet'} (or --sort {RUN_ORDER})")
    return metric


def _ordered(items: list[_T], order: Any, metrics_of: Callable[[_T], Mapping[str, Any]],
             top: int | None) -> tuple[list[_T], int]:
    """``items`` in ``order`` (a ranking, best first; ``None``: as given) and cut to ``top``;
    and how many were left out."""
    if order is not None:
        items = order.best_first(items, metrics_of)
    if top is None or top >= len(items):
        return items, 0
    return items[:top], len(items) - top


def _print_order(order: Any, left_out: int, top: int | None) -> None:
    if order is not None:
        print(f"best first by {order.describe()}")
    if left_out:
        print(f"{left_out} more run(s) not shown (--top {top}); without --top every run is")


def _op_text(text: str, full: bool) -> str:
    from ..reports.display import clip

    return text if full else clip(text, OP_CHARS, keep="head")


def _folder_metrics(output_dir: str, names: Sequence[str]) -> dict[str, dict[str, float]]:
    """Each run's latest ``loss`` and metrics ``names`` (two at most; a name also finds
    ``eval_<name>``) from its files (trainer_state.json), as the report reads them."""
    from ..reports.experiment_data import load_experiment

    # The experiment is not tracked: a store that does not exist keeps MLflow out of it (it
    # would be imported, and its default store opened, for nothing).
    nowhere = f"sqlite:///{os.path.abspath(output_dir)}/.rapidfire/untracked.db"
    data = load_experiment(output_dir, metric=",".join(list(dict.fromkeys(names))[:2]),
                           tracking_uri=nowhere)
    return {name: {key: value for key in run.history if (value := run.latest(key)) is not None}
            for name, run in data.runs.items()}


def _status_of_folder(output_dir: str, full: bool = False, sort: str | None = None,
                      top: int | None = None) -> int:
    from ..control.folder_control import Inbox, alive, folder_runs
    from ..reports.display import table
    from ..reports.experiment_data import read_ops, read_search_log
    from ..reports.ranking import default_ranking, read_ranking
    from ..reports.report import format_value
    from ..shared_state.runs import shown_status
    from ..storage.layout import Layout
    from .experiments import knob_columns

    layout = Layout(output_dir)
    last = {event.run: event.result for event in read_ops(layout.ops_log)}
    trials = {e.run: e.trial for e in read_search_log(layout.search_log) if e.trial}
    runs = folder_runs(output_dir)
    recorded = read_ranking(output_dir)
    wanted = [sort] if sort not in (None, RUN_ORDER) else []
    metrics = _folder_metrics(output_dir, [recorded.key if recorded else "eval_loss", *wanted])
    logged = [metrics.get(r.name, {}) for r in runs]
    ranking = recorded or default_ranking(logged)
    order = sort_order(sort, ranking, logged)
    shown_key = (order or ranking).key
    knobs = knob_columns([r.knobs for r in runs], full=full)
    who = alive(layout)
    rows = [[r.name, shown_status(r.status, training=who is not None), r.global_step,
             r.chunks_done, format_value((order or ranking).value_of(m)), *cells,
             _op_text(last.get(r.name, ""), full)]
            for r, m, cells in zip(runs, logged, knobs.cells)]
    headers = ["run", "status", "steps", "chunks", shown_key, *knobs.names, "last op"]
    if trials:  # an adaptive search: which trial of its study each run is
        headers.insert(1, "trial")
        for r, row in zip(runs, rows):
            row.insert(1, trials.get(r.name, "-"))
    by_row = dict(zip(map(id, rows), logged))
    rows, left_out = _ordered(rows, order, lambda row: by_row[id(row)], top)
    state = "training" if who is not None else "not training"
    where = f" (pid {who.pid} on {who.host})" if who is not None else ""
    waiting = Inbox(layout).waiting() if who else 0
    print(f"experiment in {output_dir} (not tracked in MLflow, {state}{where})")
    _print_order(order, 0, top)
    print(table(headers, rows))
    _print_order(None, left_out, top)
    _print_hidden(knobs.hidden)
    _print_front(output_dir)
    if waiting:
        print(f"{waiting} op(s) waiting for the next chunk boundary")
    return 0


def _print_hidden(hidden: int) -> None:
    if hidden:
        print(f"{hidden} more knob(s) differ between the runs (--full shows every knob)")


def _print_front(output_dir: str | None) -> None:
    """A multi-objective search's Pareto front, from the experiment's ``search.csv``."""
    if output_dir is None:
        return
    from ..reports.experiment_data import read_search_log
    from ..reports.report import pareto_front
    from ..storage.layout import Layout

    front = pareto_front(read_search_log(Layout(output_dir).search_log))
    if front is not None:
        print(f"Pareto front: {' '.join(front) or '-'} (no run better in every objective)")


def _folder_records(output_dir: str | None) -> dict[str, Any]:
    """The runs' records in the experiment's folder (its shared state), by name; none without
    a folder or a state there."""
    if output_dir is None:
        return {}
    from ..control.folder_control import folder_runs

    try:
        return {r.name: r for r in folder_runs(output_dir)}
    except Exception:  # noqa: BLE001 - a folder being written, or not ours: MLflow alone
        return {}


_PROGRESS = re.compile(r"(?:chunk|done) (\d+)/(\d+)")


def ahead_of_mlflow(status: str | None, progress: str, record: Any) -> tuple[str | None, str]:
    """A run's status and progress as its MLflow tags say them, or, where the folder's shared
    state ``record`` (a :class:`~..shared_state.runs.RunState`) has more chunks done (MLflow
    lags: its writes are queued, or the process was killed before they were made), as the
    folder says them: a run with chunks done is never ``pending``."""
    if record is None:
        return status, progress
    found = _PROGRESS.match(progress or "")
    shown = int(found.group(1)) if found else 0
    if record.chunks_done <= shown:
        return status, progress
    total = f"/{found.group(2)}" if found else ""
    return (record.status.value,
            f"chunk {record.chunks_done}{total} (step {record.global_step})")


def show_status(output_dir: str | None, *, full: bool, untracked: bool,
                where: dict[str, Any], sort: str | None = None, top: int | None = None) -> int:
    """Print the runs of the experiment ``where`` names (tracked in MLflow), or of the
    untracked one in ``output_dir``; ``full``: op texts whole and every knob. The rows are
    best first by the experiment's ranking metric, or by ``sort`` (:func:`sort_order`); with
    ``top``, only the first ``top``."""
    if top is not None and top < 1:
        raise ValueError(f"--top takes a number of runs of at least 1, not {top}")
    if untracked:
        assert output_dir is not None  # only a named folder is untracked
        return _status_of_folder(output_dir, full, sort, top)
    from ..reports.display import table
    from ..reports.kind_metrics import kind_columns
    from ..reports.ranking import ranking_of
    from ..reports.report import format_value
    from ..shared_state.runs import shown_status
    from .experiments import knob_columns, tracked_knobs
    from .send import experiment_runs, find_experiment

    exp = find_experiment(**where)
    rows = []
    runs = experiment_runs(exp)
    ranking = ranking_of([run.tags for run in runs], [run.metrics for run in runs])
    order = sort_order(sort, ranking, [run.metrics for run in runs])
    # The knobs are among each run's params (its whole config): those that differ.
    knobs = knob_columns(*tracked_knobs([run.params for run in runs],
                                        [run.tags for run in runs]), full=full)
    # An adaptive search's runs: which trial each is, and when the sampler proposed it.
    proposed = any("rapidfire.trial" in run.tags for run in runs)
    kind = kind_columns(run.metrics for run in runs)  # a reward model's accuracy, ...
    # The metric the rows are sorted by has a column, by the key the runs logged it under.
    for by in (ranking, order):
        if by is None:
            continue
        key = next((k for k in by.keys if any(k in run.metrics for run in runs)), by.key)
        if key not in ("loss", "eval_loss", *kind.values()):
            kind[key] = key
    folder = _folder_records(output_dir)
    for run, cells in zip(runs, knobs.cells):
        tags, metrics = run.tags, run.metrics
        status, progress = ahead_of_mlflow(tags.get("rapidfire.status"),
                                           tags.get("rapidfire.progress", "-"),
                                           folder.get(tags.get("rapidfire.run", "")))
        # A run in the rotation of an experiment not training (Ctrl-C, a kill): interrupted.
        rows.append([tags.get("rapidfire.run"), shown_status(status, training=exp.training),
                     progress, format_value(metrics.get("loss")),
                     format_value(metrics.get("eval_loss")),
                     *(format_value(metrics.get(key)) for key in kind.values()), *cells,
                     _op_text(tags.get("rapidfire.op", ""), full),
                     _op_text(tags.get("rapidfire.op.result", ""), full)])
        if proposed:
            when = tags.get("rapidfire.proposed_at", "")
            rows[-1][2:2] = [tags.get("rapidfire.trial", "-"),
                             when.replace("T", " ")[:19] if when else "-"]
    print(f"experiment {exp.describe()} in {exp.uri}")
    headers = ["run", "status", "progress", "loss", "eval_loss", *kind, *knobs.names,
               "pending op", "last op"]
    if proposed:
        headers[2:2] = ["trial", "proposed"]
    by_row = {id(row): run.metrics for row, run in zip(rows, runs)}
    rows, left_out = _ordered(rows, order, lambda row: by_row[id(row)], top)
    _print_order(order, 0, top)
    print(table(headers, rows))
    _print_order(None, left_out, top)
    _print_hidden(knobs.hidden)
    _print_front(output_dir)
    return 0
