"""The metric that tells one trainer kind's runs apart, shown beside ``loss`` and ``eval_loss``
in every table of runs.

A reward model is judged by how often it scores the chosen answer above the rejected one
(``accuracy``), a GRPO or RLOO policy by its mean ``reward``, a DPO or KTO one by the margin of
its implicit rewards (``rewards/margins``): losses alone do not say which run is ahead. Which
kind an experiment is shows in what its runs logged, so a view needs nothing but their metrics:
the first of :data:`KIND_METRICS` that some run logged gets a column, its eval form when runs
were evaluated (``eval_accuracy``), else its training form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["KIND_METRICS", "kind_columns"]

# (column header, logged key), most telling first; a kind logs at most one of them.
KIND_METRICS = (("accuracy", "accuracy"), ("reward", "reward"),
                ("margins", "rewards/margins"))


def kind_columns(metrics: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``{header: logged key}`` of the kind's own metric among the runs' latest ``metrics``
    (empty when none is logged: SFT, Distillation)."""
    keys: set[str] = set()
    for logged in metrics:
        keys.update(logged)
    for header, key in KIND_METRICS:
        if f"eval_{key}" in keys:
            return {f"eval_{header}": f"eval_{key}"}
        if key in keys:
            return {header: key}
    return {}
