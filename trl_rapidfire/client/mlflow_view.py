"""The trl-rapidfire saved view of MLflow's runs table: the child runs listed flat, best first
by the experiment's ranking metric, the knobs that differ in the first columns.

Where it opens. MLflow 3.17's UI picks its mode from the ``workflowType`` URL parameter (else
the browser's saved choice, else ``genai``), not from the experiment tag
``mlflow.experimentKind``: an experiment opened plainly lands on the GenAI overview ("Traces
0"), even when tagged ``custom_model_development``. And its runs table nests child runs under
their parent, collapsed, unless the table is filtered and sorted by something other than the
start time (the UI then fetches no parents, and child runs are rows of their own). So each
MLflow experiment holding trl-rapidfire runs gets a saved view (an experiment tag, as the UI's
own "Views" menu writes them) that filters the child runs, sorts them by the experiment's
ranking metric (:mod:`..reports.ranking`: what the policy, ``best_run``, ``status`` and the
panel rank by; a name sort would read run-0, run-1, run-10, run-100) and shows the knobs that
differ first, then their status, progress and metrics; :func:`runs_url` opens it in "Model
training" mode.

Who writes it: ``trl-rapidfire dashboard`` for every experiment in the store when it starts and
for each new one while it serves (:func:`ensure_all_views`), and the control panel's page for
the experiment it shows (its server side computes the tag, :func:`view_answer`, which only
reads; the page sets it through MLflow's REST API, as MLflow's own UI does), so that "Open in
MLflow" lands on it for every experiment the project made.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["SETTLED", "VIEW_ID", "VIEW_NAME", "VIEW_TAG", "ensure_all_views", "ensure_runs_view",
           "link_panel", "runs_url", "runs_view_state", "view_answer", "view_knobs"]

VIEW_ID = "trl-rapidfire"
VIEW_NAME = "trl-rapidfire runs"
# Where MLflow 3.17's UI keeps saved views (experiment tags) and the URL parameter opening one.
_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_TAG = _VIEW_TAG_PREFIX + VIEW_ID
_VIEW_PARAM = "viewStateShareKey"
# "Model training" in the UI's GenAI / Model training switch.
_WORKFLOW = {"workflowType": "machine_learning"}
_MAX_KNOB_COLUMNS = 8
_MAX_RUNS = 1000  # runs read to find the knobs that differ (the UI's own page is 100)


def runs_url(base_url: str, experiment_id: str) -> str:
    """The runs table of MLflow experiment ``experiment_id``, in "Model training" mode, through
    the trl-rapidfire saved view (:func:`ensure_runs_view` writes it; the dashboard does)."""
    query = urlencode({**_WORKFLOW, _VIEW_PARAM: VIEW_ID})
    return f"{base_url.rstrip('/')}/#/experiments/{quote(str(experiment_id), safe='')}/runs?{query}"


def link_panel(client: Any, experiment_id: str) -> None:
    """Link MLflow's experiment page to the panel: its description (``mlflow.note.content``,
    shown above the runs table) gets a link, unless a person wrote a description of their
    own."""
    from .panel_app import PANEL_PATH

    key = "mlflow.note.content"
    note = (f"[trl-rapidfire control panel]({PANEL_PATH}#/{experiment_id}): stop, resume, "
            "delete and clone runs with buttons.")
    old = client.get_experiment(experiment_id).tags.get(key)
    if old is None or (old.startswith("[trl-rapidfire control panel]") and old != note):
        client.set_experiment_tag(experiment_id, key, note)


def runs_view_state(knobs: Sequence[str] = (), ranking: Any = None) -> dict[str, Any]:
    """The saved view's state: the runs table's search facets, sort and columns.

    ``ranking``: a :class:`~..reports.ranking.RankingMetric` (default: the training loss,
    lower is better) whose metric the runs are sorted by, best first; its key as logged.

    A filter and a sort other than the start time, together, are what make the UI list child
    runs flat: with either missing it fetches their parent run and folds them under it.

    The column order puts the knobs that differ first, then the status, progress, the
    ranking metric and the losses: the table draws only the columns in sight, and the UI's
    default order (metrics, params, tags) pushes what tells the runs apart off the screen.
    MLflow 3.17's runs table applies the view's ``columnOrder`` to the columns it lists
    (``applyColumnState`` with ``applyOrder``) after its fixed ones (the run's name and its
    start time), whatever group (params, metrics, tags) each belongs to; ``selectedColumns``
    says which are shown.
    """
    from ..tracking.tags import OP_RESULT_TAG, OP_TAG, PROGRESS_TAG, ROLE_TAG, STATUS_TAG

    key = ranking.key if ranking is not None else "loss"
    metrics = list(dict.fromkeys([key, "loss", "eval_loss"]))
    columns = [*(f"params.`{k}`" for k in knobs), f"tags.`{STATUS_TAG}`",
               f"tags.`{PROGRESS_TAG}`", *(f"metrics.`{m}`" for m in metrics),
               f"tags.`{OP_TAG}`", f"tags.`{OP_RESULT_TAG}`"]
    return {
        "searchFilter": f"tags.`{ROLE_TAG}` = 'run'",
        "orderByKey": f"metrics.`{key}`",
        "orderByAsc": ranking is None or not ranking.greater_is_better,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "selectedColumns": columns,
        "columnOrder": columns,
    }


def view_knobs(params: Sequence[Mapping[str, str]], tags: Sequence[Mapping[str, str]]
               ) -> list[str]:
    """The params that are the knobs of the sweep and differ between the runs (``params`` and
    ``tags``: each run's), for the view's first columns: the rule of every runs table
    (:func:`~.experiments.tracked_knobs`, then
    :func:`~trl_rapidfire.reports.display.differing_keys`)."""
    from ..reports.display import differing_keys
    from ..reports.knob_fields import expand_knobs
    from .experiments import tracked_knobs

    rows, names = tracked_knobs(params, tags)
    if names is None:
        # A LoRA config that differs in one field is that field's column (its own param,
        # trainers/run_builder.py), not a long description cut where the difference hides;
        # runs logged before those params existed keep the whole knob.
        expanded = expand_knobs(rows)
        if all(k in p for row, p in zip(expanded, params) for k in row):
            rows = expanded
    return differing_keys(rows, names)[:_MAX_KNOB_COLUMNS]


def _view_ranking(tags: Sequence[Mapping[str, str]],
                  metrics: Sequence[Mapping[str, Any]]) -> Any:
    """The runs' ranking metric, its key as they logged it (the view sorts by a logged key:
    ``accuracy`` may be logged as ``eval_accuracy``)."""
    from ..reports.ranking import RankingMetric, ranking_of

    ranking = ranking_of(tags, metrics)
    logged = next((k for k in ranking.keys if any(k in m for m in metrics)), ranking.key)
    return RankingMetric(logged, ranking.greater_is_better, ranking.source, ranking.by)


def _envelope(state: dict[str, Any]) -> str:
    """The tag's value, in the envelope the UI's "Views" menu writes (so it is listed there
    too and a person can leave it or delete it like their own)."""
    return json.dumps({"name": VIEW_NAME, "createdAt": int(time.time() * 1000),
                       "state": json.dumps(state, sort_keys=True)})


def _same_state(old: str | None, state: dict[str, Any]) -> bool:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return old is not None and json.loads(old).get("state") == json.dumps(
            state, sort_keys=True)
    return False


def ensure_runs_view(client: Any, experiment_id: str) -> int:
    """Write (or bring up to date) the trl-rapidfire saved view of an MLflow experiment: the tag
    :data:`VIEW_TAG`. Returns how many runs it holds (a view made before they are all
    registered may lack knob columns: it is written again once they are)."""
    from ..tracking.tags import ROLE_TAG

    runs = client.search_runs([experiment_id], filter_string=f"tags.`{ROLE_TAG}` = 'run'",
                              max_results=_MAX_RUNS)
    params = [run.data.params for run in runs]
    tags = [run.data.tags for run in runs]
    state = runs_view_state(view_knobs(params, tags),
                            _view_ranking(tags, [run.data.metrics for run in runs]))
    if not _same_state(client.get_experiment(experiment_id).tags.get(VIEW_TAG), state):
        client.set_experiment_tag(experiment_id, VIEW_TAG, _envelope(state))
    return len(runs)


SETTLED = -1
"""In ``ensure_all_views``'s ``done``: two looks in a row found the same runs."""


def ensure_all_views(client: Any, experiments: Sequence[Any], done: dict[str, int]) -> None:
    """:func:`ensure_runs_view` and :func:`link_panel` for each MLflow experiment of
    ``experiments`` (:class:`~.experiments.Experiment`, newest first) that is not settled in
    ``done`` (per MLflow experiment and its trl-rapidfire experiments, the runs the last look
    found, or :data:`SETTLED` once two looks found the same: updated). A dashboard that
    serves for days asks again every few seconds, and reads an experiment's runs only until
    they are all registered."""
    by_id: dict[str, list[str]] = {}
    for exp in experiments:
        by_id.setdefault(exp.experiment_id, []).append(exp.rf_experiment)
    for experiment_id, rf_ids in by_id.items():
        key = " ".join([experiment_id, *sorted(rf_ids)])
        if done.get(key) == SETTLED:
            continue
        runs = ensure_runs_view(client, experiment_id)
        done[key] = SETTLED if runs and done.get(key) == runs else runs
        link_panel(client, experiment_id)


def view_answer(store: Any, query: Any) -> dict[str, str]:
    """The panel's ``GET /rapidfire/api/view`` (same query as ``/api/runs``): the saved view's
    tag for the MLflow experiment of the trl-rapidfire experiment the page shows, ``{"key",
    "state", "value"}`` (``state``: the view's state as the tag's envelope holds it, for the
    page to compare with the tag it has; ``value``: the envelope to set). Only reads."""
    from .panel_runs import reader_for

    reader = reader_for(store)
    rows = reader.rows(query.experiment, query.rfid)[:_MAX_RUNS]
    params = reader.params({r["id"]: None for r in rows})
    tags = [r["tags"] for r in rows]
    metrics = [{k: v[0] for k, v in r.items() if isinstance(v, list) and v} for r in rows]
    state = runs_view_state(view_knobs([params.get(r["id"], {}) for r in rows], tags),
                            _view_ranking(tags, metrics))
    return {"key": VIEW_TAG, "state": json.dumps(state, sort_keys=True),
            "value": _envelope(state)}
