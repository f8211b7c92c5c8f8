"""The control panel's "why a config wins" view: each knob's importance for the objective and
the knobs as parallel axes, computed by :mod:`..reports.why_wins` (the report's own reading of
the runs) from the store the server serves.

``GET /rapidfire/api/why?experiment=<MLflow id>&rfid=<trl-rapidfire id>`` (the same query as
``/api/runs``, no token; ``metric`` and ``mode`` name the objective) answers ``{"objective",
"mode", "method", "importance": [[knob, share], ...], "axes": [...], "runs": [run ids, in the
axes' order], "values": [...]}``. The objective is the metric the panel ranks by: the
experiment's ranking metric (:mod:`..reports.ranking`: the policy's, ``best_run``'s, the
report's) unless the page's selector names another; each run's latest value of it.
The page asks it only while its "why" view is open (Optuna's fANOVA takes a second or more at
500 runs), never more often than every ``_EVERY`` refreshes. It only reads.
"""

from __future__ import annotations

from typing import Any

from ..storage.layout import run_order
from .panel_runs import RunsQuery, expanded, knob_names, reader_for

__all__ = ["MAX_RUNS", "why_answer"]

MAX_RUNS = 5000  # runs one answer reads (the first in run order beyond that: said in "note")
_SCORES = ("loss", "eval_loss")  # what a default ranking looks at (reports/ranking.py)


def why_answer(store: Any, query: RunsQuery) -> dict[str, Any]:
    """The route's answer to ``query`` from the MLflow tracking ``store``."""
    from ..reports.ranking import RankingMetric, ranking_of
    from ..reports.why_wins import importance_method, knob_importance, parallel_axes

    reader = reader_for(store)
    # In run order (run-0, run-1, ...), as the report reads them: the parallel lines come in
    # that order, and past MAX_RUNS the first runs are the ones shown. (The importances do not
    # depend on the order: knob_importance puts the runs in its own.)
    rows = sorted(reader.rows(query.experiment, query.rfid), key=lambda r: run_order(r["name"]))
    note = ""
    if len(rows) > MAX_RUNS:
        note = f"the first {MAX_RUNS} of {len(rows)} runs"
        rows = rows[:MAX_RUNS]
    params = expanded(reader.params({r["id"]: knob_names(r["tags"]) for r in rows}))
    # A run tracked before the rapidfire.knobs tag gives its whole config: a param holding the
    # run's own name (its output_dir) differs but tunes nothing.
    knobs = [{k: v for k, v in params.get(r["id"], {}).items()
              if knob_names(r["tags"]) is not None or r["name"] not in v} for r in rows]
    ranking = ranking_of([r["tags"] for r in rows],
                         [{k: v[0] for k, v in r.items() if k in _SCORES and v} for r in rows])
    if query.metric is not None and query.metric not in ranking.keys:
        ranking = RankingMetric(query.metric, (query.mode or ranking.mode) == "max")
    elif query.mode is not None:
        ranking = RankingMetric(ranking.key, query.mode == "max", ranking.source, ranking.by)
    values = [ranking.value_of({k: v[0] for k, v in r.items() if isinstance(v, list) and v})
              for r in rows]
    importance = knob_importance(knobs, values, mode=ranking.mode)
    return {"objective": ranking.key, "mode": ranking.mode, "method": importance_method(),
            "importance": [[k, share] for k, share in importance],
            "axes": [dict(a, range=list(a["range"])) if "range" in a else a
                     for a in parallel_axes(knobs)],
            "runs": [r["id"] for r in rows], "values": values, "note": note}
