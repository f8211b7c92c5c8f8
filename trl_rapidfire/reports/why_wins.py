"""Why a config wins, as numbers the views draw: each knob's importance for the objective, the
Pareto front of two objectives, and the knobs as the axes of a parallel-coordinates view.

Pure functions of the runs' knobs and objective values: nothing is drawn here and matplotlib
is not imported, so the browser panel and the report share one reading of the runs.

Knob values arrive as the views see them, numbers or text (MLflow keeps params as strings:
``"0.001"``, ``"linear"``, ``"8"``). A knob is numeric when every run's value parses as a
finite number, else categorical (its values compared as text). A knob that a run lacks is, for
that run, the category ``-`` (the knob is then categorical), and a knob with one value in all
runs tells nothing and is left out. Knobs that always move together (a LoRA ``r`` with its
``lora_alpha`` at twice it: each value of one goes with one value of the other, in every run)
cannot be told apart by any run: they are one knob, named by both
(``peft_config.r + lora_alpha``), with the first one's values.

Importance comes from Optuna's evaluators where Optuna is installed (fANOVA where
scikit-learn is too, else PED-ANOVA), over a study built from the runs with
``optuna.trial.create_trial``. Without Optuna it comes from :func:`fallback_importance`: the
share of the variance of the objective's ranks that the knob's levels explain (ε², the
correlation ratio corrected for the number of levels), numeric knobs with many values cut into
quantile bins. :func:`importance_method` says which one answered last.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "LOG_SPAN",
    "MISSING",
    "fallback_importance",
    "importance_method",
    "knob_importance",
    "numeric_values",
    "parallel_axes",
    "pareto_front",
]

MISSING = "-"
"""The category of a run that lacks a knob."""
LOG_SPAN = 10.0
"""A numeric knob whose values are all positive and span at least this ratio (a decade) is
drawn on a log scale."""
FALLBACK = "fallback: rank variance explained by each knob (epsilon squared)"
_FANOVA = "optuna fANOVA (FanovaImportanceEvaluator)"
_PED_ANOVA = "optuna PED-ANOVA (PedAnovaImportanceEvaluator)"
# A numeric knob with more distinct values than this is cut into this many quantile bins for
# the fallback: with a level per value, each level would hold one or two runs and explain
# noise (ε² corrects for the levels' number, but it is noisy with so few runs per level).
_BINS = 6
# Seed of fANOVA's random forest: the same runs give the same importances in every view.
_SEED = 0
# fANOVA's forest: Optuna's default (64 trees, depth 64) takes 2.6 s at 500 runs and 12 s at
# 2000 (5 knobs, 2 cores); 32 trees of depth 8 take 0.5 s and 1.4 s and give the same shares
# to a percent (a few knobs, a few hundred runs do not need deeper trees).
_TREES = 32
_DEPTH = 8
_last_method: list[str] = []


def _text(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else str(value)
    return str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def numeric_values(values: Sequence[Any]) -> list[float] | None:
    """``values`` as floats if every one parses as a finite number (``"0.001"``, ``8``),
    else ``None`` (the knob is categorical). Booleans are categories."""
    out = []
    for value in values:
        number = _number(value)
        if number is None:
            return None
        out.append(number)
    return out


def _columns(knobs: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Knob name -> each run's value (``None`` where the run lacks it), in first-seen order,
    without the knobs that have one value in all runs, and knobs that move together as one
    (:func:`_together`)."""
    names = list(dict.fromkeys(name for row in knobs for name in row))
    columns = {name: [row.get(name) for row in knobs] for name in names}
    differ = {name: column for name, column in columns.items()
              if len({_text(v) for v in column}) > 1}
    merged: dict[str, list[Any]] = {}
    groups: list[list[str]] = []
    for name, column in differ.items():
        group = next((g for g in groups if _together(differ[g[0]], column)), None)
        if group is None:
            groups.append([name])
        else:
            group.append(name)
    for group in groups:
        merged[_joined(group)] = differ[group[0]]
    return merged


def _together(first: Sequence[Any], second: Sequence[Any]) -> bool:
    """Whether two knobs always move together: each value of one goes with a single value of
    the other, both ways, in every run (a one-to-one map between their values), and some value
    is shared by two runs (knobs whose every run has a value of its own pair up by
    coincidence: three runs of three learning rates and three batch sizes)."""
    forward: dict[str, str] = {}
    backward: dict[str, str] = {}
    for a, b in zip(map(_text, first), map(_text, second)):
        if forward.setdefault(a, b) != b or backward.setdefault(b, a) != a:
            return False
    return len(forward) < len(first)


def _joined(names: Sequence[str]) -> str:
    """One name for knobs that move together: ``peft_config.r + lora_alpha`` (a config
    object's fields by their own names after the first)."""
    first, *rest = names
    prefix = first.rsplit(".", 1)[0] + "." if "." in first else None
    return " + ".join([first, *(n[len(prefix):] if prefix and n.startswith(prefix) else n
                                for n in rest)])


def _natural(text: str) -> list[Any]:
    # Numbers inside the text compared as numbers: "LoraConfig(r=8" before "LoraConfig(r=16".
    return [(0, float(part), "") if _number(part) is not None else (1, 0.0, part)
            for part in re.split(r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)", text) if part]


def _categories(column: Sequence[Any]) -> list[str]:
    """A categorical knob's values as text, in a stable order: numbers in them compared as
    numbers (``r=8`` before ``r=16``), the rest alphabetically."""
    return sorted(set(map(_text, column)), key=_natural)


def _is_log(numbers: Sequence[float]) -> bool:
    low, high = min(numbers), max(numbers)
    return low > 0 and high / low >= LOG_SPAN


def parallel_axes(knobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The knobs as the axes of a parallel-coordinates view, one per knob that differs between
    the runs (in first-seen order).

    Each axis is a dict: ``name``; ``kind``: ``"log"`` (numeric, all positive, spanning at
    least a decade), ``"linear"`` (other numeric) or ``"category"``; ``range``: ``(low, high)``
    of a numeric knob, or ``categories``: a categorical knob's values as text, evenly spaced
    bottom to top in this order; ``positions``: each run's place on the axis in ``[0, 1]``
    (``0`` the bottom), in the order of ``knobs``.
    """
    axes: list[dict[str, Any]] = []
    for name, column in _columns(knobs).items():
        numbers = numeric_values(column)
        if numbers is not None:
            low, high = min(numbers), max(numbers)
            log = _is_log(numbers)
            scale = (lambda x: math.log10(x)) if log else (lambda x: x)
            span = scale(high) - scale(low)
            positions = [(scale(x) - scale(low)) / span for x in numbers]
            axes.append({"name": name, "kind": "log" if log else "linear",
                         "range": (low, high), "positions": positions})
        else:
            categories = _categories(column)
            place = {c: i / (len(categories) - 1) for i, c in enumerate(categories)}
            axes.append({"name": name, "kind": "category", "categories": categories,
                         "positions": [place[_text(v)] for v in column]})
    return axes


def pareto_front(points: Sequence[tuple[float, float]],
                 modes: tuple[str, str] = ("min", "min")) -> list[int]:
    """Indices of the non-dominated points, sorted by the first objective's value, low to
    high (then the second's, then index). A point is dominated when another is at least as
    good in both objectives and better in one; equal points do not dominate each other.
    Points with a missing or non-finite value are on no front. ``modes``: ``"min"`` or
    ``"max"`` for each objective."""
    signs = tuple(_sign(mode) for mode in modes)
    scored = []
    for index, point in enumerate(points):
        a, b = (_number(v) for v in point)
        if a is not None and b is not None:
            scored.append((signs[0] * a, signs[1] * b, index))
    # Sorted by the first objective, best first: a point is on the front when its second
    # objective is better than that of every point before it, or equals the best so far with
    # an equal first objective too (a tie of the whole point).
    scored.sort()
    front: list[int] = []
    best: tuple[float, float] | None = None
    for a, b, index in scored:
        if best is None or b < best[1] or (b == best[1] and a == best[0]):
            front.append(index)
            if best is None or b < best[1]:
                best = (a, b)
    return sorted(front, key=lambda i: (float(points[i][0]), float(points[i][1]), i))


def _sign(mode: str) -> float:
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
    return 1.0 if mode == "min" else -1.0


def importance_method() -> str:
    """How :func:`knob_importance` measured importance in its last call in this process
    (before any call: how it would), e.g. ``optuna fANOVA (FanovaImportanceEvaluator)``."""
    if _last_method:
        return _last_method[-1]
    return _available_method()


def _available_method() -> str:
    try:
        import optuna  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return FALLBACK
    try:
        import sklearn  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return _PED_ANOVA
    return _FANOVA


def _scored(knobs: Sequence[Mapping[str, Any]], objective: Sequence[float | None]
            ) -> tuple[list[Mapping[str, Any]], list[float]]:
    if len(knobs) != len(objective):
        raise ValueError(f"{len(knobs)} runs' knobs but {len(objective)} objective values")
    pairs = [(row, _number(value)) for row, value in zip(knobs, objective)]
    kept = [(row, value) for row, value in pairs if value is not None]
    return [row for row, _ in kept], [value for _, value in kept]


def knob_importance(knobs: Sequence[Mapping[str, Any]], objective: Sequence[float | None], *,
                    mode: str = "min") -> list[tuple[str, float]]:
    """Each knob's importance for the objective, largest first, summing to 1 (runs without an
    objective value left out; knobs with one value left out). Optuna's fANOVA evaluator (or
    PED-ANOVA without scikit-learn) where optuna is installed, else
    :func:`fallback_importance`; says which in :func:`importance_method`.

    ``knobs[i]`` and ``objective[i]`` are one run's; ``mode``: ``"min"`` or ``"max"``, which
    objective value is better. Fewer than two scored runs, or no knob that differs: ``[]``.
    """
    _sign(mode)
    rows, values = _scored(knobs, objective)
    columns = _columns(rows)
    if len(values) < 2 or not columns:
        return []
    method = _available_method()
    result: dict[str, float] | None = None
    if method != FALLBACK:
        result = _optuna_importance(columns, values, mode, method)
    if result is None:
        method = FALLBACK
        result = dict(fallback_importance(rows, values))
    _last_method[:] = [method]
    return _normalized(result)


def _normalized(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """Scores as shares summing to 1, largest first (ties by name); all zero: equal shares
    (no knob explains more than another)."""
    cleaned = {k: max(v, 0.0) if math.isfinite(v) else 0.0 for k, v in scores.items()}
    total = sum(cleaned.values())
    if total <= 0:
        cleaned = dict.fromkeys(cleaned, 1.0)
        total = float(len(cleaned))
    return sorted(((k, v / total) for k, v in cleaned.items()), key=lambda kv: (-kv[1], kv[0]))


def _optuna_importance(columns: Mapping[str, Sequence[Any]], values: Sequence[float],
                       mode: str, method: str) -> dict[str, float] | None:
    """Optuna's importances over a study of one trial per run (``None`` where Optuna cannot
    answer for these runs, e.g. PED-ANOVA with too few of them: the fallback answers)."""
    # pylint: disable=import-outside-toplevel
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    params: dict[str, list[Any]] = {}
    distributions: dict[str, Any] = {}
    for name, column in columns.items():
        numbers = numeric_values(column)
        if numbers is not None:
            distributions[name] = FloatDistribution(min(numbers), max(numbers),
                                                    log=_is_log(numbers))
            params[name] = numbers
        else:
            texts = [_text(v) for v in column]
            distributions[name] = CategoricalDistribution(_categories(column))
            params[name] = texts
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per study built
    try:
        study = optuna.create_study(direction="minimize" if mode == "min" else "maximize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    # The trials in one order whatever order the runs came in (by value, then by their
    # params' text): fANOVA's forest draws its samples by position, so the same runs listed
    # in another order (a refresh, a sort in the panel) would weigh the knobs differently.
    trials = sorted(((value, {name: params[name][i] for name in columns})
                     for i, value in enumerate(values)),
                    key=lambda t: (t[0], repr([(n, _text(t[1][n])) for n in sorted(t[1])])))
    study.add_trials([optuna.trial.create_trial(params=row, distributions=distributions,
                                                value=value) for value, row in trials])
    if method == _FANOVA:
        evaluator: Any = optuna.importance.FanovaImportanceEvaluator(
            n_trees=_TREES, max_depth=_DEPTH, seed=_SEED)
    else:
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-API and small-sample warnings
            scores = optuna.importance.get_param_importances(study, evaluator=evaluator,
                                                             normalize=False)
    except (ValueError, RuntimeError, ZeroDivisionError):
        return None
    scores = {name: float(scores.get(name, 0.0)) for name in columns}
    if not any(math.isfinite(v) and v > 0 for v in scores.values()):
        return None
    return scores


def fallback_importance(knobs: Sequence[Mapping[str, Any]], objective: Sequence[float | None]
                        ) -> list[tuple[str, float]]:
    """Importance without Optuna: for each knob, the share of the variance of the objective's
    ranks explained by the knob's levels, ε² = (SS_between - (k - 1) MS_within) / SS_total
    (the correlation ratio less what k levels explain by chance; below zero counts as zero).
    A numeric knob with more than 6 values is cut into 6 quantile bins, so it is judged on as
    many levels as a categorical one. Ranks, not values: one diverged run cannot decide.

    Shares summing to 1, largest first; the same leaving-out as :func:`knob_importance`."""
    rows, values = _scored(knobs, objective)
    columns = _columns(rows)
    if len(values) < 2 or not columns:
        return []
    ranks = _ranks(values)
    return _normalized({name: _epsilon_squared(_levels(column), ranks)
                        for name, column in columns.items()})


def _ranks(values: Sequence[float]) -> list[float]:
    """Average ranks (ties share the mean of their places)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2
        start = end + 1
    return ranks


def _levels(column: Sequence[Any]) -> list[str]:
    """Each run's level of a knob: its value, or for a numeric knob with many values, its
    quantile bin."""
    numbers = numeric_values(column)
    if numbers is None or len(set(numbers)) <= _BINS:
        return [_text(v) for v in column]
    places = _ranks(numbers)
    return [str(min(int(p * _BINS / len(numbers)), _BINS - 1)) for p in places]


def _epsilon_squared(levels: Sequence[str], ranks: Sequence[float]) -> float:
    groups: dict[str, list[float]] = {}
    for level, rank in zip(levels, ranks):
        groups.setdefault(level, []).append(rank)
    n, k = len(ranks), len(groups)
    mean = sum(ranks) / n
    total = sum((r - mean) ** 2 for r in ranks)
    if total == 0 or k < 2:
        return 0.0
    between = sum(len(g) * (sum(g) / len(g) - mean) ** 2 for g in groups.values())
    within = total - between
    mean_within = within / (n - k) if n > k else 0.0
    return max((between - (k - 1) * mean_within) / total, 0.0)
