"""MLflow's private names read outside ``tracking/``, here and nowhere else (the wall for
MLflow's entities; the store repair's ``SqlAlchemyStore._engine_map`` is in
:mod:`trl_rapidfire.tracking.mlflow_store`). ``tests/runtime/test_foreign_wall.py`` fails loudly
on an MLflow that lacks one.

Checked against the MLflow versions in :data:`MLFLOW_CHECKED` (the test suite's,
constraints.txt):

* ``RunData._metric_objs``: a run's latest value of each metric *with its step*, as the
  tracking server sent it. The public ``RunData.metrics`` is only key -> value, and the panel
  shows the step; asking the server for every metric's history instead costs a request per
  run and metric.

Imports nothing of the training stack (the client uses it: no torch, no MLflow at import).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MLFLOW_CHECKED", "MLFLOW_NAMES", "latest_metrics"]

# The MLflow versions whose private names below were read in MLflow's source and tested (the
# test suite's, constraints.txt). A new MLflow is added once tests/runtime/test_foreign_wall.py
# passes with it.
MLFLOW_CHECKED = ("3.17.2",)

# Every private name this module reads, by the class that holds it (the wall's test asserts
# each exists on the installed MLflow's objects).
MLFLOW_NAMES: dict[str, tuple[str, ...]] = {"entities.RunData": ("_metric_objs",)}


def latest_metrics(run: Any) -> list[Any]:
    """A searched MLflow run's latest metrics as MLflow's ``Metric`` objects (``key``,
    ``value``, ``step``), from ``run.data._metric_objs``. Checked against
    :data:`MLFLOW_CHECKED`; empty where another MLflow lacks the name (the panel then shows
    the run without metrics rather than fail)."""
    return list(getattr(run.data, "_metric_objs", None) or [])
