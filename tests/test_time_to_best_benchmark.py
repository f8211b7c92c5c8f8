"""benchmarks/time_to_best.py: its work count, and a quick run whose exactness check passes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "time_to_best.py"


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
