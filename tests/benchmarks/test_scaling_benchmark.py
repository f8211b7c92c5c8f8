"""``benchmarks/scaling.py`` runs, prints how the costs grow with the number of configs and with
finer chunks against plain TRL in the same process, and checks the runs bitwise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--quick", "--threads", "1",
         "--json", str(out), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.slow
def test_the_scaling_quick_run_prints_a_row_per_n_and_checks_the_weights(tmp_path):
    out, figures = _run(tmp_path)
    rows = figures["rows"]
    assert [r["n"] for r in rows] == [4, 16]
    for row in rows:
        assert row["step_ms_mean"] > 0 and row["construct_ms_per_run"] > 0
        assert 0 < row["wall_ratio"] and 0 < row["first_ratio"]
        assert row["bitwise_equal"] == row["bitwise_total"] > 0
    assert re.search(r"weights: bitwise equal for (\d+)/\1 sampled configs", out), out[-2000:]
    assert re.search(r"step time \(mean\), N=16 / N=4 +\d+\.\d+ +target <= 1\.1", out)


@pytest.mark.slow
def test_the_chunk_sweep_quick_run_prints_each_chunk_count(tmp_path):
    out, figures = _run(tmp_path, "--chunks-sweep")
    rows = figures["rows"]
    assert [r["chunks"] for r in rows] == [2, 8]
    assert all(r["wall_s"] > 0 and r["switch_share"] is not None for r in rows)
    assert re.search(r"bitwise equal across num_chunks for (\d+)/\1 configs", out), out[-2000:]
