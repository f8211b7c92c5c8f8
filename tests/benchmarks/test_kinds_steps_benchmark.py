"""``benchmarks/kinds_steps.py --quick`` runs as its docstring says: per kind, the steps both
sides trained (the same), their seconds inside steps, the ratio, and whether every run's
adapter equals its plain TRL twin (no absolute time is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_run_prints_each_kinds_step_ratio_and_its_exactness(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kinds_steps.py"),
                           "--quick", "--kinds", "reward", "rloo", "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    figures = {r["kind"]: r for r in json.loads(out.read_text())}
    assert sorted(figures) == ["reward", "rloo"]
    for kind, r in figures.items():
        assert r["bitwise"] and r["steps"] > 0
        assert r["ratio_in_steps"] == pytest.approx(r["rf_in_steps"] / r["plain_in_steps"])
        row = next(line.split() for line in proc.stdout.splitlines()
                   if line.startswith(kind + " "))
        assert row[1] == str(r["steps"]) and row[-1] == "yes"
        assert float(row[4]) == pytest.approx(r["ratio_in_steps"], abs=5e-4)
