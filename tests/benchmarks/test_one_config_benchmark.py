"""``benchmarks/one_config.py --quick`` runs as its docstring says and prints both sides'
construct and train seconds and the ratio (no absolute time is asserted: the figures are the
benchmark's to print)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_run_prints_both_sides_and_the_ratio(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "one_config.py"),
                           "--quick"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1",
                                                PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    row = re.search(r"sft +tracking=none +plain +([\d.]+) s \(construct ([\d.]+) \+ train "
                    r"([\d.]+)\) +rf +([\d.]+) s \(construct ([\d.]+) \+ train ([\d.]+);.*"
                    r"ratio ([\d.]+)", proc.stdout)
    assert row, proc.stdout
    plain, p_construct, p_train, rf, r_construct, r_train, ratio = map(float, row.groups())
    assert abs(plain - p_construct - p_train) < 2e-3 and abs(rf - r_construct - r_train) < 2e-3
    # The seconds are printed rounded to 1 ms and the ratio is taken from the unrounded
    # ones, so a recomputed ratio may differ by what that rounding moves it (at 0.1 s
    # a side, about 1%), plus the ratio's own rounding.
    rounding = (rf / plain) * (5e-4 / rf + 5e-4 / plain) + 5e-4
    assert ratio == pytest.approx(rf / plain, abs=rounding + 1e-6)
    assert re.search(r"worst ratio [\d.]+ \(target <= 1.1\)", proc.stdout)
