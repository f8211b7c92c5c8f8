"""A chunk is recorded by the background writer after its checkpoint, off the switch path: a
kill -9 in between (checkpoint whole, record not committed, the next run already training)
loses nothing but that chunk's record, and a re-run trains the chunk again exactly once and
ends bitwise equal to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.storage.schedule import read_schedule_csv
from trl_rapidfire.testing import tiny_model_path

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
RUNS = [f"run-{i}" for i in range(4)]
CHUNKS = 3
KILL_AT = 3  # the third chunk's record

# tests/experiment_script.py (4 configs x 3 chunks), its writer killed before the KILL_AT-th
# record: the checkpoint is on disk, the chunk is not recorded, and the loop has switched to
# the next run (it waits for the chunk's start before the kill).
_CHILD = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from trl_rapidfire.engine import coordination
import experiment_script

original = coordination.Coordinator._commit
commits = [0]

def commit(self, entry, error):
    commits[0] += 1
    if commits[0] == {kill_at}:
        started = len(open(self.schedule_path).read().splitlines())
        deadline = time.time() + 60
        while self._claimed is None and time.time() < deadline:
            time.sleep(0.001)  # until the loop holds its next turn's claim
        claimed = self._claimed
        print("KILLED", entry.slot.name, entry.record.number, entry.record.end_step,
              started, claimed, flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    return original(self, entry, error)

coordination.Coordinator._commit = commit
experiment_script.main(sys.argv[1])
"""


def _env(tmp: Path) -> dict[str, str]:
    # A checkpoint at every boundary: the window between a checkpoint and its record is
    # what is tested here.
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}",
               RF_TEST_CHECKPOINT_EVERY="chunk")
    env.pop("TRL_RAPIDFIRE_WORKER", None)
    return env


def _run(argv: list[str], tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=_env(tmp), cwd=tmp, capture_output=True, text=True,
                          timeout=600, start_new_session=True)


def test_a_kill_between_checkpoint_and_record_retrains_that_chunk_once(tmp_path):
    tiny_model_path()  # built once, before the processes
    script = [sys.executable, str(TESTS / "experiment_script.py")]
    ref = _run([*script, str(tmp_path / "ref")], tmp_path)
    assert ref.returncode == 0, ref.stderr[-4000:]

    out = tmp_path / "exp"
    child = _CHILD.format(tests=str(TESTS), kill_at=KILL_AT)
    killed = _run([sys.executable, "-c", child, str(out)], tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    line = next(x for x in killed.stdout.splitlines() if x.startswith("KILLED"))
    _, run, number, end_step, _, claimed = line.split(" ", 5)
    assert claimed != "None", "the loop had not moved on to its next turn"
    # What the kill left: the chunk's checkpoint whole on disk, its record nowhere.
    assert (out / ".rapidfire" / "checkpoints" / run / f"checkpoint-{end_step}").is_dir()
    before = {(r.run, r.number) for r in read_schedule_csv(out / "schedule.csv")}
    assert (run, int(number)) not in before and len(before) == KILL_AT - 1
    state = FileStore(out / ".rapidfire", "", create=False).peek().to_json()
    assert state["runs"][run]["chunks_done"] == int(number)

    again = _run([*script, str(out)], tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    rows = read_schedule_csv(out / "schedule.csv")
    counts = Counter((r.run, r.number) for r in rows)
    assert set(counts) == {(r, n) for r in RUNS for n in range(CHUNKS)}
    assert all(c == 1 for c in counts.values()), counts
    for name in RUNS:
        a = load_file(tmp_path / "ref" / "runs" / name / "final" / "adapter_model.safetensors")
        b = load_file(out / "runs" / name / "final" / "adapter_model.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key} differs"
