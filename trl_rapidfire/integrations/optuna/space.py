"""The knobs of a config group as Optuna distributions, and back (an
:class:`~trl_rapidfire.integrations.optuna.search.OptunaSearch`'s parameters).

A ``Range`` is a float (or int) distribution, log-scaled when the Range is; a ``List`` of plain
values (strings, numbers, booleans, ``None``) a categorical over those values, and any other
``List`` (``LoraConfig``s, models, reward function sets) or zip group a categorical over the
candidates' positions. A zip group is one parameter, named by its knobs joined with ``+``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...config.knobs import List, Range, same_value
from ...search.searches import Axis
from .support import require_optuna

__all__ = ["SearchSpace", "params_text"]

_PLAIN = (str, int, float, bool, type(None))


class SearchSpace:
    """The knobs of a config group as Optuna distributions, and back.

    Args:
        axes: the search's axes (:meth:`Search.knob_axes`), in declaration order.
        order: every knob's name, in the order a run's knobs are reported.
    """

    def __init__(self, axes: Sequence[Axis], order: Sequence[str]) -> None:
        optuna = require_optuna("OptunaSearch")
        dists = optuna.distributions
        self.axes = list(axes)
        self.order = list(order)
        self.distributions: dict[str, Any] = {}
        for axis in self.axes:
            name = "+".join(axis.names)
            knob = axis.knobs[0]
            if axis.is_range:
                assert isinstance(knob, Range)
                if knob.dtype is int:
                    self.distributions[name] = dists.IntDistribution(int(knob.low),
                                                                     int(knob.high), log=knob.log)
                else:
                    self.distributions[name] = dists.FloatDistribution(knob.low, knob.high,
                                                                       log=knob.log)
                continue
            assert isinstance(knob, List)
            plain = len(axis.names) == 1 and all(
                type(v) in _PLAIN and not (isinstance(v, float) and math.isnan(v))
                for v in knob.values)
            choices = tuple(knob.values) if plain else tuple(range(len(knob)))
            self.distributions[name] = dists.CategoricalDistribution(choices)

    def knobs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The knob values Optuna's ``params`` stand for. Raises ``ValueError`` naming the
        parameter when one is missing or not a value of its distribution (a recipe read back
        from a file may have been edited)."""
        chosen: dict[str, Any] = {}
        for axis in self.axes:
            name = "+".join(axis.names)
            dist = self.distributions[name]
            if name not in params:
                raise ValueError(f"parameter {name!r} is missing")
            value = params[name]
            if axis.is_range:
                number = not isinstance(value, bool) and isinstance(value, (int, float))
                if not number or not dist.low <= value <= dist.high or (
                        axis.knobs[0].dtype is int and value != int(value)):  # type: ignore
                    raise ValueError(f"parameter {name!r}={value!r} is not a value of {dist}")
                chosen[name] = int(value) if axis.knobs[0].dtype is int else float(value)  # type: ignore
                continue
            index = next((i for i, c in enumerate(dist.choices)
                          if type(c) is type(value) and c == value), None)
            if index is None:
                raise ValueError(f"parameter {name!r}={value!r} is not a value of {dist}")
            chosen.update(axis.values(index))
        return {n: chosen[n] for n in self.order}

    def holds(self, name: str, value: Any) -> bool:
        """Whether ``value`` is a value of parameter ``name``'s distribution (of its type:
        ``1`` is not the candidate ``1.0``, nor ``True``)."""
        dist = self.distributions[name]
        if hasattr(dist, "choices"):
            return any(type(c) is type(value) and c == value for c in dist.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return False
        if isinstance(dist, require_optuna("OptunaSearch").distributions.IntDistribution) \
                and value != int(value):
            return False
        return bool(dist.low <= value <= dist.high)

    def params(self, knobs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | str:
        """Optuna's params and distributions for a run with these ``knobs`` (a clone's: its
        parent's values and a person's overrides), or why they cannot be written so. A value
        outside a Range widens that parameter's distribution for this trial only (Optuna
        allows it); a value that is no candidate of a List has no categorical to go in."""
        optuna = require_optuna("OptunaSearch")
        params: dict[str, Any] = {}
        dists: dict[str, Any] = {}
        for axis in self.axes:
            name = "+".join(axis.names)
            dist = self.distributions[name]
            if any(n not in knobs for n in axis.names):
                return f"knob {name} has no value"
            if axis.is_range:
                value = knobs[axis.names[0]]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                        dist.log and value <= 0):
                    return f"{name}={value!r} is not a number of its Range"
                low, high = min(dist.low, value), max(dist.high, value)
                if isinstance(dist, optuna.distributions.IntDistribution):
                    if value != int(value):
                        return f"{name}={value!r} is not an integer"
                    dists[name] = optuna.distributions.IntDistribution(int(low), int(high),
                                                                       log=dist.log)
                    params[name] = int(value)
                else:
                    dists[name] = optuna.distributions.FloatDistribution(float(low), float(high),
                                                                         log=dist.log)
                    params[name] = float(value)
                continue
            lists = [k.values for k in axis.lists]
            index = next((i for i in range(len(lists[0]))
                          if all(same_value(knobs[n], lst[i])
                                 for n, lst in zip(axis.names, lists))), None)
            if index is None:
                shown = ", ".join(f"{n}={knobs[n]!r}" for n in axis.names)
                return f"{shown} is not one of its List's candidates"
            dists[name] = dist
            params[name] = dist.choices[index]
        return params, dists


def params_text(params: Mapping[str, Any]) -> str:
    """A trial's params as the JSON text of a recipe."""
    return json.dumps(dict(params), sort_keys=True)
