"""``OptunaSearch``: an Optuna sampler (TPE by default) proposes the runs while the experiment
trains, from the results of the runs before them.

Knobs map to Optuna distributions: a ``Range`` to a float (or int) distribution, log-scaled
when the Range is; a ``List`` of plain values (strings, numbers, booleans, ``None``) to a
categorical over those values, and any other ``List`` (``LoraConfig``s, models, reward
function sets, zip groups) to a categorical over the candidates' positions. ``max_concurrent``
runs train at a time: whenever one leaves the rotation its result is told to the study and the
sampler is asked for the next run, until ``num_runs`` were proposed.

The study is kept in ``<output_dir>/.rapidfire/optuna.journal`` (Optuna's journal storage, a
file that every worker of the experiment shares and a re-run continues). Each proposal's
sampler is seeded from ``seed`` and the trial's number, so a re-run after a crash proposes what
the first run would have: the sampler's state is a function of the study, which is on disk,
and of that seed (see :mod:`trl_rapidfire.integrations.optuna.study`).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ...config.knobs import List
from ...runtime.foreign_optuna import grid_search_space
from ...search.fingerprint import config_doc
from ...search.fingerprint import describe as describe_argument
from ...search.searches import AdaptiveSearch, RunSpec, Search, SearchError
from ...shared_state.scheduler import Order
from ...storage.layout import Layout, run_index
from .space import SearchSpace
from .study import StudyBook
from .support import require_optuna

__all__ = ["OptunaSearch"]


def _derive_seed(seed: int, number: int) -> int:
    digest = hashlib.sha256(f"trl-rapidfire/optuna/{seed}/{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


class OptunaSearch(AdaptiveSearch):
    """Runs proposed by an Optuna sampler while the experiment trains.

    Args:
        sampler: ``None`` (TPE, seeded from ``seed``), a function ``seed -> sampler`` (e.g.
            ``lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=True)``), or a
            sampler object. With ``None`` or a function each proposal gets a sampler seeded
            from ``seed`` and its trial number, so proposals are the same on a re-run, also
            after a crash; a sampler object is used as it is (its own seed holds only within
            one uninterrupted process). A ``GridSampler`` (its parameters: the knobs' names)
            gets one seed for the whole study, proposes each grid point once, and the
            search ends when every point was proposed (or ``num_runs`` were).
        num_runs: how many runs the sampler proposes in all (>= 1).
        max_concurrent: how many runs train at a time (are in the rotation); a new one is
            proposed whenever one leaves it (>= 1). 4 by default, with the default sampler's
            constant liar (each trial in flight counts as a bad result, so no proposal lands
            where a run trains): on docs/adaptive-search.md's workload (TPE + a successive
            halving pruner, 64 runs, sampler seeds 0 to 11) it came within 0.1% of the best of
            transformers' one-at-a-time search in at most its steps on more seeds than 1, 2,
            8 at a time or a concurrency widened from one as results came in, and trained the
            fewest steps but one; without the liar, 4 at a time did so on 1 seed of 12. Give
            at least the number of workers (or devices wait); 1 for TPE without a pruner on a
            small budget; any number for a sampler that does not learn (grid, random).
        metric: what the study optimizes: a logged metric (``eval_loss``; ``x`` also finds
            ``eval_x``), its value at each chunk end an intermediate value of the trial; or a
            list of them (``["eval_loss", "eval_rouge_l"]``): a multi-objective study, each
            completed run told its last value of each, the Pareto front in ``search.csv``,
            ``trl-rapidfire status`` and the report (no intermediate values: Optuna's pruners
            take one objective). The best run is then the best by the first metric (it is on
            the front); ``metric_for_best_model`` chooses another.
        direction: ``minimize`` or ``maximize``; with several metrics, one per metric.
        seed: seeds the sampler (independent of training seeds).
        zip: as for :class:`~trl_rapidfire.search.searches.GridSearch` (a zip group is one
        parameter).
        order: which runs in the rotation train first. ``"even"`` (the default): least
            progress first, every run's curve advancing together. ``"promote"``: a new run's
            first chunk first, then the most advanced run, so a run that survives its
            pruner's checks finishes (and is told to the sampler) as early as it alone could.
            On the docs' workload it came within 0.1% of transformers' best in less than
            half of transformers' time at each of seeds 0 to 3 (``"even"``: not at seed 0),
            but over seeds 0 to 11 it settled more than 0.1% above that best on 4 (1.12% at
            seed 8; ``"even"``: on 2, by 0.12% at most); see docs/adaptive-search.md.

    Raises:
        OptunaMissing: Optuna is not installed (``pip install optuna``).
    """

    def __init__(self, sampler: Any = None, *, num_runs: int, max_concurrent: int = 4,
                 metric: str | Sequence[str] = "eval_loss",
                 direction: str | Sequence[str] = "minimize", seed: int = 0,
                 zip: Sequence[Sequence[str]] = (),  # noqa: A002 - the public name
                 order: str = "even") -> None:
        optuna = require_optuna("OptunaSearch")
        for name, value in (("num_runs", num_runs), ("max_concurrent", max_concurrent)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SearchError(f"OptunaSearch needs {name} >= 1 (an integer), got {value!r}.")
        metrics, directions = _objectives(metric, direction)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SearchError(f"OptunaSearch seed must be an integer, got {seed!r}.")
        orders = [o.value for o in Order]
        if order not in orders:
            raise SearchError(f"OptunaSearch order must be one of {orders}, got {order!r}: "
                              "'even' trains the runs in the rotation side by side, 'promote' "
                              "the most advanced first.")
        if sampler is not None and not isinstance(sampler, optuna.samplers.BaseSampler) \
                and not callable(sampler):
            raise SearchError(f"OptunaSearch sampler must be an Optuna sampler, a function "
                              f"seed -> sampler, or None (TPE), got {sampler!r}.")
        super().__init__(zip=zip)
        self.sampler = sampler
        self.num_runs, self.max_concurrent = num_runs, max_concurrent
        # The first objective serves where one is needed (best_run, one-metric readers).
        self.metrics, self.directions = metrics, directions
        self.metric, self.direction, self.seed = metrics[0], directions[0], seed
        self.order = Order(order)

    def objective(self) -> tuple[str, bool]:
        """The study's metric and direction (with several: the first)."""
        return self.metric, self.direction == "maximize"

    def sampler_for(self, number: int) -> Any:
        """The sampler that proposes trial ``number``."""
        optuna = require_optuna("OptunaSearch")
        seed = _derive_seed(self.seed, number)
        if self.sampler is None:
            # Optuna's default of 10 random trials first would spend most of a small budget
            # before the model is used: a quarter of the budget, 2 to 10. The constant liar
            # (Optuna's default from 5.0 on, off and experimental in 4.x) counts the trials in
            # flight as bad results, so that no proposal lands where a running run trains.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.samplers.TPESampler(
                    seed=seed, n_startup_trials=min(10, max(2, self.num_runs // 4)),
                    constant_liar=True)
        if isinstance(self.sampler, optuna.samplers.BaseSampler):
            return self.sampler
        made = self._made(seed)
        if isinstance(made, optuna.samplers.GridSampler) and number != 0:
            # A grid's order is its seed's shuffle, and trial n takes the n-th point of it:
            # one seed for the whole study (trial 0's), or each trial's sampler would shuffle
            # another order and propose some points twice and others never.
            made = self._made(_derive_seed(self.seed, 0))
        return made

    def _made(self, seed: int) -> Any:
        """What the sampler function makes for ``seed``, checked to be a sampler."""
        optuna = require_optuna("OptunaSearch")
        made = self.sampler(seed)
        if not isinstance(made, optuna.samplers.BaseSampler):
            raise SearchError(f"OptunaSearch's sampler function returned {made!r}, not an "
                              "Optuna sampler.")
        return made

    def grid(self, space: SearchSpace) -> dict[str, list[Any]] | None:
        """The points of a ``GridSampler`` (its search space), checked against ``space``;
        ``None`` for any other sampler. Raises :class:`SearchError` naming the parameters
        when the grid's names or values are not the search's: Optuna would fail at the
        first proposal, or propose a value no knob has."""
        optuna = require_optuna("OptunaSearch")
        sampler = self.sampler_for(0)
        if not isinstance(sampler, optuna.samplers.GridSampler):
            return None
        grid = grid_search_space(sampler)  # Optuna keeps it in a private name: the wall reads it
        names = sorted(space.distributions)
        if sorted(grid) != names:
            raise SearchError(
                f"OptunaSearch's GridSampler has the parameters {sorted(grid)}; this search's "
                f"are {names} (a knob's name; a zip group's names joined with '+', its values "
                "the candidates' positions 0, 1, ...). Give the grid exactly these, or use our "
                "own grid search: the knobs as List([...]) and no search= (GridSearch).")
        for name, values in grid.items():
            bad = [v for v in values if not space.holds(name, v)]
            if bad or not values:
                raise SearchError(
                    f"OptunaSearch's GridSampler gives {name!r} the values {bad or values!r}, "
                    f"which are not values of its knob ({space.distributions[name]}). Use "
                    "values of the knob, or our own grid search: the knobs as List([...]) "
                    "and no search= (GridSearch).")
        return grid

    @property
    def sampler_name(self) -> str:
        """What proposes the runs, as the run tags and the report name it."""
        optuna = require_optuna("OptunaSearch")
        if self.sampler is None or isinstance(self.sampler, optuna.samplers.BaseSampler):
            return type(self.sampler).__name__ if self.sampler is not None else "TPESampler"
        return type(self.sampler_for(0)).__name__  # a function: what it makes

    # ------------------------------------------------------------------ the trainers' side

    def space(self, rf_config: Any, trainer_level: Mapping[str, Any]) -> SearchSpace:
        """The config group's knobs as Optuna distributions."""
        all_knobs, axes = self.knob_axes(rf_config, trainer_level)
        if not axes:
            raise SearchError("OptunaSearch needs at least one knob (a List or a Range) to "
                              "search over.")
        space = SearchSpace(axes, list(all_knobs))
        self.grid(space)  # a GridSampler over other parameters is refused before anything loads
        return space

    def describe(self, rf_config: Any, **trainer_level: Any) -> Any:
        """The sampler, seed, metric, direction, every knob, and the config with each knob
        at its first candidate (``num_runs``, ``max_concurrent`` and ``order`` are left out:
        a re-run may give the study more runs, more at a time, or another order). Both ends
        of every knob are checked as runs before anything loads."""
        space = self.space(rf_config, trainer_level)
        ends = []
        for last in (False, True):
            params = {name: (dist.choices[-1 if last else 0] if hasattr(dist, "choices")
                             else dist.high if last else dist.low)
                      for name, dist in space.distributions.items()}
            ends.append(self.build_run("run-0", 0, space.knobs(params), rf_config, trainer_level))
        template = ends[0]
        knobs = {}
        for axis in space.axes:
            for name, knob in zip(axis.names, axis.knobs):
                knobs[name] = ([describe_argument(v) for v in knob.values]
                               if isinstance(knob, List) else repr(knob))
        sampler = self.sampler
        return {"search": "OptunaSearch", "sampler": None if sampler is None else (
                    getattr(sampler, "__qualname__", None) or type(sampler).__name__),
                "seed": self.seed, **self._objective_doc(),
                "zip": [list(g) for g in self.zip_groups], "knobs": knobs,
                "template": describe_argument(config_doc(template.config)),
                "arguments": {k: describe_argument(v) for k, v in
                              sorted(template.trainer_kwargs.items())}}

    def start(self, rf_config: Any, layout: Layout,
              **trainer_level: Any) -> tuple[list[RunSpec], Any]:
        """Open (or continue) the study in the experiment's folder and return the first runs
        (one per rotation place) and the study, which the engine asks for the rest."""
        space = self.space(rf_config, trainer_level)
        book = StudyBook(space, layout, sampler_for=self.sampler_for,
                         sampler_name=self.sampler_name, num_runs=self.num_runs,
                         max_concurrent=self.max_concurrent, metrics=self.metrics,
                         directions=self.directions, grid=self.grid(space), order=self.order)
        specs = [Search.build_run(p.name, run_index(p.name) or 0, p.knobs, rf_config,
                                  trainer_level) for p in book.first_runs()]
        return specs, book

    def __repr__(self) -> str:
        zipped = f", zip={list(self.zip_groups)!r}" if self.zip_groups else ""
        return (f"OptunaSearch(sampler={self.sampler!r}, num_runs={self.num_runs}, "
                f"max_concurrent={self.max_concurrent}, "
                + ", ".join(f"{k}={v!r}" for k, v in self._objective_doc().items())
                + f", seed={self.seed}{zipped})")

    def _objective_doc(self) -> dict[str, Any]:
        """``metric`` and ``direction`` as written: one name each, or lists (one objective is
        described as before multi-objective searches existed, so its experiments continue)."""
        if len(self.metrics) == 1:
            return {"metric": self.metric, "direction": self.direction}
        return {"metric": list(self.metrics), "direction": list(self.directions)}


def _as_tuple(value: Any) -> tuple[Any, ...]:
    """One value (a string included) or a list of them, as a tuple."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(value)
    return (value,)


def _objectives(metric: Any, direction: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The search's metrics and directions, checked: as many of one as of the other."""
    metrics, directions = _as_tuple(metric), _as_tuple(direction)
    if not metrics or any(not isinstance(m, str) or not m for m in metrics):
        raise SearchError(f"OptunaSearch metric must be a logged metric's name (e.g. "
                          f"'eval_loss'), or a list of them, got {metric!r}.")
    if len(set(metrics)) != len(metrics):
        raise SearchError(f"OptunaSearch metric names {metric!r}: each metric once.")
    bad = [d for d in directions if d not in ("minimize", "maximize")]
    if bad or not directions:
        raise SearchError(f"OptunaSearch direction must be 'minimize' or 'maximize' (one per "
                          f"metric), got {direction!r}.")
    if len(directions) != len(metrics):
        raise SearchError(f"OptunaSearch has {len(metrics)} metric(s) and {len(directions)} "
                          f"direction(s): give one direction per metric, e.g. metric="
                          f"{list(metrics)!r}, direction={['minimize'] * len(metrics)!r}.")
    return metrics, directions
