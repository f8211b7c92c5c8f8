"""What an experiment reports about its runs, and how the best run is picked."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..shared_state.runs import RunStatus
from .ranking import RankingMetric, default_ranking

__all__ = ["RunResult", "latest_metrics", "metric_points", "pick_best"]


@dataclass
class RunResult:
    """One run as the user sees it after (or during) ``train()``.

    Attributes:
        name: the run's name (``run-<index>``).
        knobs: the knob values of this run.
        status: see :class:`~trl_rapidfire.shared_state.runs.RunStatus`.
        global_step: optimizer steps done.
        output_dir: the run's folder (``<output_dir>/runs/<name>``); the final adapter or model
            is in its ``final/`` subfolder.
        metrics: the latest value of every metric the run logged (``loss``, ``eval_loss``,
            ``learning_rate``, ...) and, once finished, its ``train_*`` summary.
        error: the error a failed run raised.
        last_op: the result of the last control op on this run in this session (a person's,
            or a policy's with its reason), e.g. ``ok: stopped at step 16 by
            SuccessiveHalving rung 0: ...``; the whole history is ``<output_dir>/ops.csv``.
    """

    name: str
    knobs: dict[str, Any]
    status: RunStatus
    global_step: int
    output_dir: str
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    last_op: str | None = None

    @property
    def final_dir(self) -> str:
        return f"{self.output_dir}/final"


def latest_metrics(log_history: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The latest value of each numeric key of a Trainer's ``log_history``."""
    out: dict[str, float] = {}
    for entry in log_history:
        for k, v in entry.items():
            if k in ("step", "epoch") or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            out[k] = v
    return out


def metric_points(log_history: Any, keys: Iterable[str]) -> dict[str, list[tuple[int, float]]]:
    """``{key: [(step, value), ...]}`` from a Trainer's ``log_history`` (read from a file:
    anything that is not such an entry is skipped), sorted by step; a later entry for the
    same step wins, as a re-logged point does in MLflow."""
    out: dict[str, dict[int, float]] = {}
    if not isinstance(log_history, list):
        return {}
    for entry in log_history:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            continue
        for key in keys:
            value = entry.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault(key, {})[entry["step"]] = float(value)
    return {k: sorted(v.items()) for k, v in out.items()}


def pick_best(
    runs: Sequence[RunResult],
    metric: str | None = None,
    greater_is_better: bool | None = None,
    *,
    ranking: RankingMetric | None = None,
) -> RunResult | None:
    """The best run: among the runs that completed; while none has (or when none did, every
    run having been stopped), among every run that has not failed or been deleted. A stopped
    run is not finished: it wins only over other unfinished runs, never over a completed one
    (its lower loss may just be its earlier step).

    Args:
        ranking: the experiment's ranking metric (:mod:`.ranking`: the one every view ranks
            by); without it, ``metric`` and ``greater_is_better``.
        metric: ``metric_for_best_model``; default ``eval_loss`` if every candidate that
            logged anything has one, else the latest training ``loss``.
        greater_is_better: default: ``False`` for names ending in ``loss``, else ``True``
            (transformers' rule).

    No candidate has the metric (none evaluated yet): the latest training loss decides; none
    has that either: the first candidate.
    """
    candidates = ([r for r in runs if r.status is RunStatus.COMPLETED]
                  or [r for r in runs if r.status not in (RunStatus.FAILED, RunStatus.DELETED)])
    if not candidates:
        return None
    if ranking is None:
        if metric is None:
            ranking = default_ranking(r.metrics for r in candidates)
        else:
            greater = (not metric.endswith("loss") if greater_is_better is None
                       else greater_is_better)
            ranking = RankingMetric(metric, greater)
    for by in (ranking, RankingMetric("loss")):
        # Ties keep declaration order (best_first is a stable sort).
        best = by.best_first(candidates, lambda r: r.metrics)[0]
        if by.value_of(best.metrics) is not None:
            return best
    return candidates[0]
