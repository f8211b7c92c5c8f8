"""The --quick runs of the two tracking benchmarks print what benchmarks/README.md reads:
tracking_scale.py a row per run count and the ratios of the per-run costs; panel_refresh.py a
row per run count (MLflow's runs/search, the panel's lean route, the page's own refresh measure
where Chromium is here) and the ratios."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _quick(script: str, tmp_path: Path) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_the_tracking_scale_quick_run_prints_each_cost_and_its_ratio(tmp_path):
    out = _quick("tracking_scale.py", tmp_path)
    for n in (4, 40):
        assert re.search(rf"^ +{n} runs: register +\d+\.\d +report +\d+\.\d\d +poll +\d+\.\d +"
                         r"re-register +\d+\.\d$", out, re.M), out
    assert re.search(r"^40 runs / 4 runs, per run: register \d+\.\d\d, report \d+\.\d\d, "
                     r"reregister \d+\.\d\d; per poll: \d+\.\d\d$", out, re.M), out


@pytest.mark.slow
def test_the_panel_refresh_quick_run_prints_each_refresh_and_its_ratio(tmp_path):
    out = _quick("panel_refresh.py", tmp_path)
    for n in (4, 40):
        assert re.search(rf"^ +{n} runs: runs/search +\d+ ms .* lean first +\d+ ms, +\d+ KB \|"
                         r" lean refresh +\d+ ms, +\d+\.\d KB \| page ", out, re.M), out
    assert re.search(r"^per-run cost, 40 runs / 4 runs: runs/search \d+\.\d\d, lean first "
                     r"\d+\.\d\d, lean refresh \d+\.\d\d\d", out, re.M), out
    from browser import _CHROMIUM, _DRIVER  # the page is measured where Chromium is

    if _CHROMIUM and _DRIVER:
        assert re.search(r"40 runs: .*page +\d+ ms, +\d+\.\d KB", out), out
