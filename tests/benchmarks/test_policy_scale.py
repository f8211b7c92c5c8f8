"""benchmarks/policy_scale.py: its --quick run plays every policy at two sizes and prints each
one's cost per boundary and its ratio; the played experiment halves as successive halving
does."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "policy_scale.py"


def _load():
    spec = importlib.util.spec_from_file_location("policy_scale_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_run_prints_each_policys_cost_and_ratio(capsys):
    bench = _load()
    assert bench.main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for label in ("SuccessiveHalving(eta=2)", "Hyperband(eta=2)", "PopulationBased(interval 2)"):
        at = next(i for i, row in enumerate(lines) if row.strip() == label)
        kinds = lines[at + 1:at + 4]
        assert [row.split()[0] for row in kinds] == ["all", "quiet", "deciding"]
        for row in kinds[:2]:
            cells = re.findall(r"N=(\d+): +([\d.]+) us \(([\d.]+)x, (\d+) b\.\)", row)
            assert [n for n, _, _, _ in cells] == ["8", "64"]
            assert float(cells[0][2]) == 1.0 and all(float(us) > 0 for _, us, _, _ in cells)
        all_counts = [int(c) for c in re.findall(r"(\d+) b\.", kinds[0])]
        split_counts = [int(a) + int(b) for a, b in zip(re.findall(r"(\d+) b\.", kinds[1]),
                                                          re.findall(r"(\d+) b\.", kinds[2]))]
        assert all_counts == split_counts  # every boundary is quiet or deciding


def test_the_played_experiment_halves_as_synchronous_halving():
    from trl_rapidfire.control.policies import SuccessiveHalving

    bench = _load()
    played = bench.play(SuccessiveHalving(eta=2), 32, 8)
    # 32 runs, 8 chunks, rungs at 1, 2, 4: 32 + 16 + 2 * 8 + 4 * 4 chunks trained.
    assert played[True][1] + played[False][1] == 32 + 16 + 2 * 8 + 4 * 4
    assert played[True][1] > 0  # some boundaries stopped runs
