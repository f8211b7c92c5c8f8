"""benchmarks/time_to_best.py: its work count, a quick run whose exactness check passes, and a
quick run of its search comparison (``--searches``)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_best.py"


def _load():
    spec = importlib.util.spec_from_file_location("time_to_best_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_work_counting_and_the_learning_rate_grid():
    bench = _load()
    assert bench.halving_work(16, 16, 2) == 16 + 8 + 4 * 2 + 2 * 4 + 8  # = 48
    assert bench.halving_work(4, 4, 2) == 4 + 2 + 2
    lrs = bench.learning_rates(16)
    assert lrs[0] == 1e-4 and lrs[-1] == 1e-1 and len(set(lrs)) == 16


def test_quick_run_picks_a_config_and_its_survivor_equals_plain_trl(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "figures.json"
    assert _load().main(["--quick", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["exact"] is True
    assert sum(c["status"] == "completed" for c in figures["rapidfire"]) == 1
    assert sum(c["chunks"] for c in figures["rapidfire"]) == 8  # 4 + 2 + 1 * 2


def test_quick_search_comparison_spends_the_budget_and_measures_each_method_within_it(
        tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bench = _load()
    out = tmp_path / "searches.json"
    assert bench.main(["--searches", "--quick", "--threads", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    spend = figures["budget_chunks"]
    assert spend == bench.halving_work(4, 4, 2) == 8 and figures["full_runs"] == 2
    assert figures["seeds"] == [0]
    outcomes = {o["method"]: o for o in figures["outcomes"]}
    assert list(outcomes) == ["random", "successive halving", "TPE", "TPE + pruner"]
    for method, o in outcomes.items():
        assert o["chunks_in_budget"] == len(o["trace"]) <= spend, method
        assert o["chunks_in_budget"] == min(spend, o["chunks_trained"]), method
        assert o["best_loss"] is not None and math.isfinite(o["best_loss"]), method
        # The best is the lowest loss logged at a chunk end within the budget, first reached
        # at the time recorded.
        losses = [p["eval_loss"] for p in o["trace"] if p["eval_loss"] is not None]
        assert o["best_loss"] == min(losses), method
        first = next(p for p in o["trace"] if p["eval_loss"] == o["best_loss"])
        assert o["seconds_to_best"] == first["seconds"] > 0, method
    # The methods without a policy train their full runs: exactly the budget.
    for method in ("random", "TPE"):
        assert outcomes[method]["chunks_trained"] == spend, method
        assert outcomes[method]["runs"] == 2, method
    summary = figures["summary"]
    assert set(summary["methods"]) == set(outcomes)
    assert summary["winner"]["method"] in outcomes
    assert summary["fastest_within_1pct"] in outcomes
