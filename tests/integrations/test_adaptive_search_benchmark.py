"""``benchmarks/adaptive_search.py`` at a small size: it prints each search's figures and the
ratios against transformers' ``hyperparameter_search``; one run at a time, ours trains the
trials transformers trains (the same sampler, seed and pruner on the same values): the same
configs, each trial the same steps and the same end (a trial that trained all its steps and
was pruned at its last report included: seed 2 has one, trial 8), and the same best, to the
last digit printed (no time is asserted: the figures are the benchmark's to print)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("optuna")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_one_at_a_time_it_trains_what_transformers_trains_and_finds_its_best(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "adaptive_search.py"), "--trials", "12",
         "--rows", "64", "--eval-every", "2", "--reduction-factor", "2", "--seed", "2",
         "--max-concurrent", "1", "2", "--rf-sampler", "same", "--repeats", "1",
         "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = dict(re.findall(r"^ +(hf|rf \d) +wall .*\| +(\d+) steps", proc.stdout, re.M))
    assert set(rows) == {"hf", "rf 1", "rf 2"}, proc.stdout
    assert re.search(r"rf 2 vs hf: time to best [\d.]+x \(CPU [\d.]+x", proc.stdout)
    figures = {o["name"]: o for o in json.loads(out.read_text())["outcomes"]}
    hf, one = figures["hf"], figures["rf 1"]
    assert one["steps"] == hf["steps"] > 0
    assert (one["trials"], one["pruned"], one["completed"]) == (
        hf["trials"], hf["pruned"], hf["completed"])
    assert one["best_params"]["lr_scheduler_type"] == hf["best_params"]["lr_scheduler_type"]
    assert one["best_params"]["learning_rate"] == pytest.approx(
        hf["best_params"]["learning_rate"], rel=1e-12)
    assert one["best_loss"] == pytest.approx(hf["best_loss"], rel=1e-6)
    # Trial by trial: the same config, the same steps, the same end.
    assert one["params"] == hf["params"] and one["states"] == hf["states"]
    assert [t[:2] for t in one["trace"]] == [t[:2] for t in hf["trace"]]
    full = max(steps for _, steps, _ in hf["trace"])
    ended = {str(t) for t, steps, _ in hf["trace"] if steps == full}
    assert any(hf["states"][t] == "PRUNED" for t in ended), hf["states"]  # the case is here
    # The pruner kept its study: one replay, at the first decision.
    assert one["policy"]["rebuilds"] == 1 and one["policy"]["trials_created"] == 12
