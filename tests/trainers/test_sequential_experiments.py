"""Several experiments in one process, one after another, as a notebook user or a script that
trains twice does it: each ends bitwise equal to the same training in a fresh process.

accelerate keeps process-global state (its mixed precision among it) that a finished
experiment must not leave behind: a second experiment with another precision used to fail at
setup with "AcceleratorState has already been initialized".
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sequence_script as cases  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPT = (Path(__file__).resolve().parents[1] / "sequence_script.py")
ROOT = SCRIPT.parent.parent


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    """Each case trained alone in a process of its own (two at a time)."""
    from trl_rapidfire.testing import tiny_model_path

    tiny_model_path(), tiny_model_path(seed=1)  # built once, before processes race for it
    tmp = tmp_path_factory.mktemp("fresh")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("TRL_RAPIDFIRE_WORKER", None)

    def run(case: str) -> dict[str, dict[str, torch.Tensor]]:
        out = tmp / case
        proc = subprocess.run([sys.executable, str(SCRIPT), case, str(out),
                               str(torch.get_num_threads())], env=env, cwd=tmp,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return {p.stem.removeprefix("reference-"): load_file(p)
                for p in sorted(out.glob("reference-*.safetensors"))}

    names = ["rf_sft_bf16", "rf_dpo", "plain_sft"]
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(names, pool.map(run, names)))


def _assert_equal(got, want, case):
    assert got.keys() == want.keys() and got, case
    for run in want:
        assert got[run].keys() == want[run].keys(), (case, run)
        for key in want[run]:
            assert torch.equal(got[run][key], want[run][key]), f"{case} {run}: {key} differs"


def test_experiments_one_after_another_in_one_process_equal_fresh_ones(fresh, tmp_path):
    # bf16, then another trainer and base model without it, then plain TRL.
    for case in ("rf_sft_bf16", "rf_dpo", "plain_sft"):
        _assert_equal(cases.CASES[case](tmp_path / case), fresh[case], case)


def test_after_a_failed_and_an_interrupted_experiment_the_next_ones_equal_fresh_ones(
    fresh, tmp_path
):
    cases.rf_fails(tmp_path / "fails")
    cases.rf_interrupted(tmp_path / "interrupted")
    for case in ("rf_dpo", "plain_sft", "rf_sft_bf16"):
        _assert_equal(cases.CASES[case](tmp_path / case), fresh[case], case)
