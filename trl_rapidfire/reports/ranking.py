"""The experiment's one ranking metric: the logged value that says which run is better, and
which way, shared by every view of the runs.

The policy judges runs by one metric, ``best_run`` picks by one, and a person reads tables
sorted by one: when these differ, the panel's top 10 is not the report's. So the experiment
has one :class:`RankingMetric`, chosen once where the trainer knows the policy, its config and
its search (:func:`choose_ranking`): the policy's metric, else ``metric_for_best_model``, else
the search's objective, else ``eval_loss`` when the runs are evaluated, else the training
``loss``.

It is recorded where the views that run in other processes read it: each run's MLflow tag
``rapidfire.ranking`` (set when its MLflow run is made: the panel, ``trl-rapidfire status``
and MLflow's saved view read the runs anyway) and ``<output_dir>/.rapidfire/ranking.json``
(the report, and ``status`` of an experiment MLflow does not track). A view of runs that
recorded none (a store from before it existed) ranks by :func:`default_ranking`.

Pure and light: no torch, no MLflow; the client imports it.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["RANKING_FILE", "RANKING_TAG", "RankingMetric", "choose_ranking", "default_ranking",
           "read_ranking", "recorded_ranking", "write_ranking"]

RANKING_TAG = "rapidfire.ranking"
"""The MLflow run tag holding the experiment's ranking metric (:meth:`RankingMetric.to_text`)."""
RANKING_FILE = "ranking.json"
"""The same, in the experiment's ``.rapidfire`` folder."""
_MAX_TEXT = 1000  # a recorded ranking is a short JSON object; anything longer is not ours
_T = TypeVar("_T")


@dataclass(frozen=True)
class RankingMetric:
    """The metric every view ranks runs by.

    Attributes:
        key: the logged metric (``eval_loss``, ``loss``, ``eval_accuracy``); a name without
            ``eval_`` also finds ``eval_<name>`` (as the policies and ``pick_best`` read it).
        greater_is_better: higher values are better (``mode`` ``max``).
        source: who chose it: ``policy``, ``metric_for_best_model``, ``search`` or
            ``default``.
        by: the policy or search that named it (``SuccessiveHalving``), if any.
    """

    key: str
    greater_is_better: bool = False
    source: str = "default"
    by: str = ""

    @property
    def mode(self) -> str:
        """``min`` or ``max``: which value is best."""
        return "max" if self.greater_is_better else "min"

    @property
    def keys(self) -> tuple[str, ...]:
        """The logged keys that hold the metric, in the order they are looked up."""
        return (self.key,) if self.key.startswith("eval_") else (self.key, f"eval_{self.key}")

    def describe(self) -> str:
        """``eval_loss (lower is better; SuccessiveHalving's metric)``: for a view's title."""
        why = {"policy": f"{self.by or 'the policy'}'s metric",
               "metric_for_best_model": "metric_for_best_model",
               "search": f"{self.by or 'the search'}'s objective"}.get(self.source, "")
        better = "higher" if self.greater_is_better else "lower"
        return f"{self.key} ({better} is better{'; ' + why if why else ''})"

    def value_of(self, metrics: Mapping[str, Any]) -> float | None:
        """The run's latest value of the metric (from its latest metrics), if finite."""
        for key in self.keys:
            value = metrics.get(key)
            if (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value)):
                return float(value)
        return None

    def best_first(self, items: Iterable[_T],
                   metrics_of: Callable[[_T], Mapping[str, Any]]) -> list[_T]:
        """``items`` best first by their metric's value; those without one last, each part
        in the order given (a stable sort: ties keep run order)."""
        sign = -1.0 if self.greater_is_better else 1.0
        scored: list[tuple[float, int, _T]] = []
        unscored: list[_T] = []
        for item in items:
            value = self.value_of(metrics_of(item))
            if value is None:
                unscored.append(item)
            else:
                scored.append((sign * value, len(scored), item))
        scored.sort(key=lambda entry: (entry[0], entry[1]))
        return [item for _, _, item in scored] + unscored

    def to_text(self) -> str:
        """The recorded form (a JSON object), read back by :meth:`from_text`."""
        return json.dumps({"metric": self.key, "mode": self.mode, "source": self.source,
                           "by": self.by}, sort_keys=True)

    @classmethod
    def from_text(cls, text: Any) -> RankingMetric | None:
        """A recorded ranking (text from outside: a tag, a file), or ``None`` for anything
        that does not read as one."""
        if not isinstance(text, str) or len(text) > _MAX_TEXT:
            return None
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        key, mode = doc.get("metric"), doc.get("mode")
        source, by = doc.get("source", "default"), doc.get("by", "")
        if (not isinstance(key, str) or not key.strip() or len(key) > 250
                or mode not in ("min", "max") or not isinstance(source, str)
                or not isinstance(by, str)):
            return None
        return cls(key, mode == "max", source[:40], by[:80])


def _policy_metric(policy: Any) -> tuple[str, bool, str] | None:
    """``(metric, greater_is_better, policy name)`` of the first policy that judges runs by a
    metric (several policies: the first of them that does; a :class:`Budget` has none)."""
    for one in getattr(policy, "policies", None) or [policy]:
        if one is not policy and getattr(one, "policies", None):
            found = _policy_metric(one)
            if found is not None:
                return found
            continue
        metric = getattr(one, "metric", None)
        if isinstance(metric, str) and metric.strip():
            greater = (getattr(one, "mode", None) == "max"
                       or getattr(one, "direction", None) == "maximize")
            return metric, greater, type(one).__name__
    return None


def choose_ranking(*, policy: Any = None, metric_for_best_model: Any = None,
                   greater_is_better: Any = None, objective: tuple[str, bool] | None = None,
                   search: str = "", evaluated: bool = False) -> RankingMetric:
    """The experiment's ranking metric: the ``policy``'s (a policy object, or several), else
    ``metric_for_best_model`` (as ``pick_best`` has always read it: the name as logged, else
    ``eval_<name>``; ``greater_is_better`` by default ``False`` for a loss), else the search's
    ``objective`` (``(metric,
    greater_is_better)``, from the search named ``search``), else ``eval_loss`` when the runs
    are ``evaluated``, else the training ``loss``."""
    found = _policy_metric(policy) if policy is not None else None
    if found is not None:
        return RankingMetric(found[0], found[1], "policy", found[2])
    if isinstance(metric_for_best_model, str) and metric_for_best_model.strip():
        key = metric_for_best_model
        greater = (bool(greater_is_better) if isinstance(greater_is_better, bool)
                   else not key.endswith("loss"))
        return RankingMetric(key, greater, "metric_for_best_model")
    if objective is not None:
        return RankingMetric(objective[0], bool(objective[1]), "search", search)
    return RankingMetric("eval_loss" if evaluated else "loss")


def default_ranking(metrics: Iterable[Mapping[str, Any]]) -> RankingMetric:
    """The ranking of runs that recorded none: ``eval_loss`` where every run that logged
    anything logged it, else the training ``loss`` (``pick_best``'s rule)."""
    logged = [m for m in metrics if m]
    evaluated = bool(logged) and all(
        RankingMetric("eval_loss").value_of(m) is not None for m in logged)
    return RankingMetric("eval_loss" if evaluated else "loss")


def recorded_ranking(tags: Iterable[Mapping[str, str]]) -> RankingMetric | None:
    """The ranking the runs' ``rapidfire.ranking`` tags record: the one most of them carry (a
    clone or a proposed run may carry none), ``None`` when none does."""
    counts = Counter(t.get(RANKING_TAG) for t in tags if t.get(RANKING_TAG))
    for text, _ in counts.most_common():
        ranking = RankingMetric.from_text(text)
        if ranking is not None:
            return ranking
    return None


def ranking_of(tags: Sequence[Mapping[str, str]],
               metrics: Sequence[Mapping[str, Any]]) -> RankingMetric:
    """What a view of tracked runs ranks by: the recorded ranking, else the default one."""
    return recorded_ranking(tags) or default_ranking(metrics)


def _path(output_dir: str | os.PathLike) -> Path:
    # storage.layout's .rapidfire folder (state_dir); not imported, to keep this module light.
    return Path(output_dir) / ".rapidfire" / RANKING_FILE


def write_ranking(output_dir: str | os.PathLike, ranking: RankingMetric) -> None:
    """Record ``ranking`` in the experiment's folder (replaced whole, atomically)."""
    from ..storage.own_files import write_atomic

    path = _path(output_dir)
    write_atomic(path, ranking.to_text() + "\n")


def read_ranking(output_dir: str | os.PathLike) -> RankingMetric | None:
    """The ranking recorded in the experiment's folder, or ``None`` (none recorded, or a file
    that does not read as one)."""
    from ..storage.own_files import read_bytes

    try:
        text = read_bytes(_path(output_dir), max_bytes=_MAX_TEXT).decode("utf-8")
    except (OSError, ValueError):
        return None
    return RankingMetric.from_text(text.strip())
