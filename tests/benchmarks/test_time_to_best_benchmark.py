"""benchmarks/time_to_best.py: its work count and baseline sample, a quick run whose figures
are all printed and whose exactness check passes, the peers (slow), and a quick run of its
search comparison (``--searches``)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_best.py"


def _load():
    spec = importlib.util.spec_from_file_location("time_to_best_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch):
    """The benchmark module, run offline; what it sets for the whole process put back
    afterwards: torch's thread count (--threads), transformers' verbosity (at error,
    TrainingArguments' disable_tqdm defaults to True: later tests' experiments would show no
    progress) and the progress bars of transformers and datasets."""
    import datasets
    import transformers

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    verbosity = transformers.utils.logging.get_verbosity()
    bars = (transformers.utils.logging.is_progress_bar_enabled(),
            datasets.is_progress_bar_enabled())
    yield _load()
    torch.set_num_threads(threads)
    transformers.utils.logging.set_verbosity(verbosity)
    if bars[0]:
        transformers.utils.logging.enable_progress_bar()
    if bars[1]:
        datasets.enable_progress_bars()


def test_work_counting_and_the_learning_rate_grid():
    bench = _load()
    assert bench.halving_work(16, 16, 2) == 16 + 8 + 4 * 2 + 2 * 4 + 8  # = 48
    assert bench.halving_work(4, 4, 2) == 4 + 2 + 2
    lrs = bench.learning_rates(16)
    assert lrs[0] == 1e-4 and lrs[-1] == 1e-1 and len(set(lrs)) == 16
    assert len(set(bench.learning_rates(256))) == 256


def test_the_baseline_sample_spreads_over_the_rates_and_holds_the_winner():
    sides = _load().sibling("time_to_best_sides")
    lrs = [float(i) for i in range(1, 17)]
    assert sides.sample_rates(lrs, 4) == [1.0, 6.0, 11.0, 16.0]
    # The winner replaces the nearest inner sample; the ends stay.
    assert sides.sample_rates(lrs, 4, [8.0]) == [1.0, 8.0, 11.0, 16.0]
    assert sides.sample_rates(lrs, 4, [11.0]) == [1.0, 6.0, 11.0, 16.0]
    # A rate off the grid (Optuna's) is put in too.
    assert 7.5 in sides.sample_rates(lrs, 8, [7.5]) and len(sides.sample_rates(lrs, 8, [7.5])) == 8
    assert sides.sample_rates(lrs, 32) == lrs
    assert sides.sample_rates([1.0, 2.0], 8, [1.5]) == [1.0, 1.5, 2.0]


def test_eval_strategy_policy_falls_back_to_chunk_where_the_package_lacks_it(bench, monkeypatch):
    import trl_rapidfire

    sides = bench.sibling("time_to_best_sides")
    assert sides.resolve_eval_strategy(bench, "chunk") == ("chunk", "")

    def refuses(**kwargs):
        raise ValueError("'policy' is not a valid IntervalStrategy")

    monkeypatch.setattr(trl_rapidfire, "RFSFTConfig", refuses)
    used, note = sides.resolve_eval_strategy(bench, "policy")
    assert used == "chunk" and "not accepted" in note


@pytest.mark.slow
def test_quick_run_prints_every_figure_and_its_winner_equals_plain_trl(bench, tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    figures = json.loads(out.read_text())
    assert figures["exact"] is True
    assert figures["eval_strategy_used"] in ("policy", "chunk")
    assert figures["report_to"] == "mlflow" and figures["threads"] == 1
    (result,) = figures["results"]
    assert (result["configs"], result["chunks"], result["policy"]) == (4, 4, "sh")
    # 4 configs of 4 chunks halved at rungs 1 and 2: 4 + 2 + 1 * 2 chunks.
    assert result["rf"]["chunks_trained"] == 8
    assert sum(r["status"] == "completed" for r in result["rf"]["runs"]) == 1
    assert result["work_bound"] == result["halving_bound"] == 2.0
    base = result["baseline"]
    assert base["sample"] == 2 and base["scaled"] is True
    assert base["scaled_seconds"] == pytest.approx(base["sample_seconds"] * 4 / 2)
    assert result["ratio"] == pytest.approx(base["scaled_seconds"] / result["rf"]["seconds"])
    assert result["bound_reached"] == pytest.approx(result["ratio"] / result["work_bound"])
    assert 0 < result["rf"]["first_metric_seconds"] <= result["rf"]["seconds"]
    assert result["quality"]["gap"] is not None and math.isfinite(result["quality"]["gap"])
    assert all(c["equal"] for c in result["exactness"])
    parts = result["rf"]["parts"]
    assert parts["registration"]["calls"] == 4  # one MLflow run per config
    assert parts["training_steps"]["calls"] == 8 * 2  # 2 steps a chunk
    assert parts["evaluation"]["calls"] >= 1 and parts["policy"]["calls"] == 8
    assert parts["instrumentation_share"] < 0.01
    assert base["parts"]["training_steps"]["calls"] == 2 * 8
    for line in ("baseline, plain TRL one config after another (SCALED: 2 of 4 configs",
                 "rapidfire, construct + train() until it returns:", "ratio baseline / RF:",
                 "work bound: 16 chunks (baseline) / 8 trained by RF = 2.00x",
                 "first metric: RF", "time to RF's best:", "quality: RF best eval_loss",
                 "where RF's time went", "registration (ensure_run)", "training steps",
                 "evaluation", "switching (engine)", "policy decisions",
                 "MLflow tracking thread busy", "summary (baseline SCALED"):
        assert line in printed, line
    assert "exactness: RF winner's final eval_loss == the same config trained alone" in printed
    assert "): ok" in printed


@pytest.mark.slow
def test_quick_run_with_peers_reports_each_peer_or_why_it_was_left_out(bench, tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert bench.main(["--quick", "--peers", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    (entry,) = json.loads(out.read_text())["peers"]
    peers = {p["name"]: p for p in entry["peers"]}
    assert set(peers) == {"hf-optuna", "ray-asha"}
    for name, module in (("hf-optuna", "optuna"), ("ray-asha", "ray")):
        if importlib.util.find_spec(module) is None:
            assert not peers[name]["available"] and f"{name:<10} skipped" in printed
            continue
        assert peers[name]["available"], peers[name]["note"]
        assert peers[name]["trials"] == 4 and math.isfinite(peers[name]["best_loss"])
        assert 0 < peers[name]["time_to_best"] <= peers[name]["wall"] + 1
        assert "vs RF sh" in printed


@pytest.mark.slow
def test_quick_search_comparison_spends_the_budget_and_measures_each_method_within_it(
        bench, tmp_path):
    pytest.importorskip("optuna")
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
