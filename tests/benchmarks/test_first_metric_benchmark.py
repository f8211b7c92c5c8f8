"""``benchmarks/first_metric.py --quick`` runs as the README says and prints, for each N, the
construction and first-metric seconds and the ratio to the smallest N (no absolute time is
asserted: the figures are the benchmark's to print)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_run_prints_each_ns_first_metric_and_its_ratio(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_metric.py"),
                           "--quick"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1",
                                                PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = re.findall(r"^ +(\d+) \| +([\d.]+) s \| +([\d.]+) s \| +([\d.]+)$", proc.stdout,
                      re.M)
    assert [int(n) for n, *_ in rows] == [2, 8], proc.stdout
    for _, construction, first, _ in rows:
        # The first evaluation comes after construction ended, and both were timed.
        assert 0 < float(construction) < float(first)
    assert float(rows[0][3]) == 1.0 and float(rows[1][3]) > 0
