"""``benchmarks/turn_costs.py`` runs and prints a cost for every part of a turn."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_turn_costs_quick_run_prints_every_part(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "turn_costs.py"), "--quick", "--threads", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = {m.group(1).strip(): (int(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^([^\d\n]+?) +(\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+$", out, re.M)}
    # Every turn claims, switches in and out, and (8 runs x 4 chunks) leaves a checkpoint at
    # each boundary but the last of each run.
    turns = int(re.search(r"8 runs, (\d+) turns", out).group(1))
    assert turns == 32, out
    assert rows["claim (shared state: lock, journal, decision)"][0] >= turns
    assert rows["switch in (all of it)"][0] >= turns
    assert rows["switch out (random streams, accelerate state)"][0] == turns
    assert rows["boundary checkpoint, in the run's turn"][0] == 8 * 3
    assert all(mean > 0 for _, mean in rows.values())
    assert re.search(r"schedule\.csv gaps [\d.]+ ms per turn, [\d.]+% of chunk time", out)


@pytest.mark.slow
def test_a_one_step_turn_makes_a_bounded_number_of_calls(tmp_path):
    """Issue 56's short-turn workload (8 configs x 32 steps in one-step chunks), counted, not
    timed: the calls a turn makes besides its step. 1,105 before issue 56's cuts, 801 after;
    the bound leaves room for a Python or library version, not for a turn that walks the runs
    or does a second transaction."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "turn_costs.py"), "--fine-chunks",
         "--count-calls", "--threads", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = re.search(r"([\d,]+) at 2 chunks \((\d+) turns\), ([\d,]+) at 32 chunks \((\d+) "
                       r"turns\)", proc.stdout)
    assert counts, proc.stdout
    few, few_turns, many, many_turns = (int(g.replace(",", "")) for g in counts.groups())
    assert (few_turns, many_turns) == (16, 256)
    per_turn = int(re.search(r"calls a turn besides its step: (\d+)", proc.stdout).group(1))
    assert per_turn == round((many - few) / (many_turns - few_turns))
    assert 0 < per_turn < 1000, proc.stdout  # fails on the code before the cuts (1,105)
