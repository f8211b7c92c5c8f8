"""Why a config wins, as numbers: knob importance (Optuna's fANOVA and the fallback written
here), the Pareto front of two objectives, and the axes of a parallel-coordinates view."""

from __future__ import annotations

import math
import random
import sys

import pytest

from trl_rapidfire.reports.why_wins import (
    FALLBACK,
    MISSING,
    fallback_importance,
    importance_method,
    knob_importance,
    parallel_axes,
    pareto_front,
)


def _runs(count=60, seed=0, deciding="learning_rate"):
    """Knobs as MLflow keeps them (text), and an objective that one knob decides: the
    learning rate by its distance from 3e-4 (a valley, not a slope), or the scheduler."""
    rng = random.Random(seed)
    knobs, objective = [], []
    for _ in range(count):
        lr = 10 ** rng.choice([-5, -4.5, -4, -3.5, -3, -2.5, -2])
        row = {"learning_rate": str(lr), "lr_scheduler_type": rng.choice(["linear", "cosine"]),
               "per_device_train_batch_size": str(rng.choice([8, 16, 32])),
               "warmup_ratio": rng.choice([0.0, 0.1]), "seed": "42"}
        knobs.append(row)
        if deciding == "learning_rate":
            value = (math.log10(lr) + 3.5) ** 2
        else:
            value = 1.0 if row["lr_scheduler_type"] == "linear" else 0.0
        objective.append(value + rng.gauss(0, 0.05))
    return knobs, objective


def _check_shares(importance, decider):
    names = [k for k, _ in importance]
    assert "seed" not in names  # one value in every run: left out
    assert sorted(names) == ["learning_rate", "lr_scheduler_type",
                             "per_device_train_batch_size", "warmup_ratio"]
    assert sum(v for _, v in importance) == pytest.approx(1.0)
    assert [v for _, v in importance] == sorted((v for _, v in importance), reverse=True)
    assert importance[0][0] == decider and importance[0][1] > 0.6, importance


@pytest.mark.parametrize("decider", ["learning_rate", "lr_scheduler_type"])
def test_the_knob_that_decides_gets_most_of_the_importance_with_optuna_and_without(decider):
    pytest.importorskip("optuna")
    pytest.importorskip("sklearn")
    knobs, objective = _runs(deciding=decider)
    # Runs without an objective value are left out, whatever their knobs.
    knobs += [{"learning_rate": "1", "seed": "7"}] * 3
    objective += [None, float("nan"), None]
    importance = knob_importance(knobs, objective, mode="min")
    assert importance_method() == "optuna fANOVA (FanovaImportanceEvaluator)"
    _check_shares(importance, decider)
    assert knob_importance(knobs, objective) == importance  # seeded: the same every time
    _check_shares(fallback_importance(knobs, objective), decider)


def test_without_optuna_the_fallback_answers_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    knobs, objective = _runs(seed=1)
    importance = knob_importance(knobs, objective, mode="max")
    assert importance_method() == FALLBACK
    assert importance == fallback_importance(knobs, objective)
    _check_shares(importance, "learning_rate")
    # Nothing to compare: fewer than two scored runs, or no knob that differs.
    assert knob_importance(knobs[:1], objective[:1]) == []
    assert knob_importance([{"a": 1}, {"a": 1}], [0.1, 0.2]) == []
    # No knob explains anything: equal shares.
    assert fallback_importance([{"a": "x"}, {"a": "y"}, {"a": "x"}, {"a": "y"}],
                               [1.0, 1.0, 1.0, 1.0]) == [("a", 1.0)]
    with pytest.raises(ValueError, match="mode"):
        knob_importance(knobs, objective, mode="best")


def test_pareto_front_against_a_hand_computation():
    points = [(1.0, 5.0), (2.0, 3.0), (3.0, 4.0), (2.0, 3.0), (0.5, 9.0), (4.0, 1.0),
              (float("nan"), 0.0), (4.0, 2.0), (5.0, 1.0)]
    # Minimising both: (3,4) is beaten by (2,3), (4,2) by (4,1), (5,1) by (4,1); the two
    # equal (2,3) beat each other in nothing; a point with NaN is on no front.
    assert pareto_front(points) == [4, 0, 1, 3, 5]
    # Maximising both: (5,1) has the best first objective, (0.5,9) the best second; (4,2)
    # beats (4,1), (3,4) beats both (2,3); nothing beats (1,5) in both.
    assert pareto_front(points, ("max", "max")) == [4, 0, 2, 7, 8]
    # Minimise the first, maximise the second: (0.5,9) beats everything.
    assert pareto_front(points, ("min", "max")) == [4]
    assert pareto_front([]) == [] and pareto_front([(1, 2)]) == [0]
    assert pareto_front([("1", "2"), ("2", "1")]) == [0, 1]  # numbers as text, as MLflow's


def test_parallel_axes_scales():
    knobs = [{"lr": "1e-5", "sched": "linear", "batch": 8, "lora": "LoraConfig(r=16)",
              "fp16": True, "seed": 1},
             {"lr": "1e-3", "sched": "cosine", "batch": "16", "lora": "LoraConfig(r=8)",
              "fp16": False, "seed": 1},
             {"lr": "1e-4", "sched": "linear", "batch": 12, "lora": "LoraConfig(r=32)",
              "seed": 1}]
    axes = {a["name"]: a for a in parallel_axes(knobs)}
    assert list(axes) == ["lr", "sched", "batch", "lora", "fp16"]  # seed: one value
    # Two decades: a log scale, 1e-4 in the middle.
    assert axes["lr"]["kind"] == "log" and axes["lr"]["range"] == (1e-5, 1e-3)
    assert axes["lr"]["positions"] == pytest.approx([0.0, 1.0, 0.5])
    # 8 to 16 is not a decade: linear.
    assert axes["batch"]["kind"] == "linear" and axes["batch"]["range"] == (8.0, 16.0)
    assert axes["batch"]["positions"] == pytest.approx([0.0, 1.0, 0.5])
    assert axes["sched"] == {"name": "sched", "kind": "category",
                             "categories": ["cosine", "linear"], "positions": [1.0, 0.0, 1.0]}
    # Numbers inside text in their numeric order; evenly spaced.
    assert axes["lora"]["categories"] == ["LoraConfig(r=8)", "LoraConfig(r=16)",
                                          "LoraConfig(r=32)"]
    assert axes["lora"]["positions"] == [0.5, 0.0, 1.0]
    # Booleans are categories; a run without the knob is the category "-".
    assert axes["fp16"]["kind"] == "category"
    assert axes["fp16"]["categories"] == [MISSING, "False", "True"]
    assert axes["fp16"]["positions"] == [1.0, 0.5, 0.0]
    # Values that span a decade but include 0 cannot be on a log scale.
    zero = parallel_axes([{"w": 0}, {"w": 100}, {"w": 1}])[0]
    assert zero["kind"] == "linear" and zero["positions"] == [0.0, 1.0, 0.01]


def test_the_importance_does_not_depend_on_the_order_the_runs_come_in():
    # The panel and the report list runs in their own orders (a sort, a refresh): the same
    # runs must get the same importances, to the last digit.
    pytest.importorskip("optuna")
    pytest.importorskip("sklearn")
    knobs, objective = _runs(count=40, seed=3)
    first = knob_importance(knobs, objective)
    order = list(range(len(knobs)))
    random.Random(1).shuffle(order)
    again = knob_importance([knobs[i] for i in order], [objective[i] for i in order])
    assert again == first
