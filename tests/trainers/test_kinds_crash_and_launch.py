"""KTO, Reward, RLOO and Distillation in real processes: an experiment killed mid-chunk
(kill -9 of its process group) and re-run, and one trained by two workers under ``accelerate
launch``, end every run bitwise equal to plain TRL training it alone (one thread on both
sides: bitwise equality holds at a fixed thread count)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launched import launch_env
from trainer_kinds import KINDS, same_adapter

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "kind_script.py"
ACCELERATE = [
    sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
    "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
]


def _run(cmd: list[str], tmp: Path, *, killed: bool = False, **env: str) -> None:
    proc = subprocess.run(cmd, env=launch_env(tmp, **env), cwd=tmp, capture_output=True,
                          text=True, timeout=600, start_new_session=True)
    if killed:
        assert proc.returncode != 0, "the experiment was meant to be killed"
    else:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _assert_equals_plain(kind: str, out: Path, tmp: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i, lr in enumerate((1e-3, 3e-3)):
            alone = KINDS[kind].plain(tmp / f"plain-{i}", learning_rate=lr)
            alone.train()
            alone.save_model()
            assert same_adapter(out / "runs" / f"run-{i}" / "final", tmp / f"plain-{i}"), i
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_killed_mid_chunk_then_rerun_ends_as_plain_trl(kind, tmp_path):
    out = tmp_path / "exp"
    # run-1 begins its second step after some boundary is on disk: killed mid-experiment.
    _run([sys.executable, str(SCRIPT), kind, str(out)], tmp_path, killed=True,
         RF_TEST_KILL="run-1:1:durable")
    assert not (out / "runs" / "run-1" / "final").exists()
    _run([sys.executable, str(SCRIPT), kind, str(out)], tmp_path)
    _assert_equals_plain(kind, out, tmp_path)


@pytest.mark.parametrize("kind", ["reward", "distillation"])
def test_two_workers_under_accelerate_launch_end_as_plain_trl(kind, tmp_path):
    out = tmp_path / "exp"
    _run([*ACCELERATE, str(SCRIPT), kind, str(out)], tmp_path)
    _assert_equals_plain(kind, out, tmp_path)
