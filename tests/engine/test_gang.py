"""FSDP runs are trained by a gang of all workers; single-device runs by one worker each.

The multi-process tests launch ``tests/gang_script.py`` with ``accelerate launch --multi_gpu
--num_processes 2`` on CPU (gloo, one thread per process) and compare every run's final adapter,
tensor for tensor, with plain TRL: a gang run with the same config trained by ``SFTTrainer``
under the same launch, a single-device run with ``SFTTrainer`` in one process.

On CPU, accelerate 1.15 never selects FSDP by itself (its FSDP mode is reserved for GPU-like
devices: ``accelerate/state.py``, ``AcceleratorState.__init__``), and a config with ``fsdp``
would train data-parallel. Both sides here call ``trl_rapidfire.testing.fsdp_on_cpu()`` first,
so accelerate applies FSDP2's ``fully_shard`` as on GPUs: gang runs train on ``DTensor`` shards
(checked), and their checkpoints go through the Trainer's FSDP routines, gathered
(``FULL_STATE_DICT``) or one file per shard (``SHARDED_STATE_DICT``, the kill test).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from launched import GANG_RUNS, GANG_SCRIPT, ONE_MACHINE_LAUNCH, train_gang_references
from safetensors.torch import load_file

from trl_rapidfire.testing import tiny_model_path

SCRIPT = GANG_SCRIPT
ACCELERATE = [sys.executable, *ONE_MACHINE_LAUNCH]
RUNS = GANG_RUNS


def _run(*args, **kwargs):
    from test_workers_and_crashes import _run as run

    return run(*args, **kwargs)


def _env(tmp, **extra):
    from test_workers_and_crashes import _env as env

    return env(tmp, **extra)


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Path:
    """Each config trained by plain TRL: gang configs under the launch, the others alone."""
    tiny_model_path()
    tmp = tmp_path_factory.mktemp("gang-references")
    train_gang_references(tmp, _env(tmp))
    return tmp


def _assert_equal_to_references(out: Path, references: Path) -> None:
    for run, (folder, _, _) in RUNS.items():
        got = load_file(out / "runs" / run / "final" / "adapter_model.safetensors")
        want = load_file(references / folder / "final" / "adapter_model.safetensors")
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), f"{run}: {key} differs"


@pytest.mark.slow
def test_gang_and_single_runs_interleave_and_equal_plain_trl(references, tmp_path):
    out = tmp_path / "exp"
    proc = _run([*ACCELERATE, str(SCRIPT), "rf", str(out)],
                _env(tmp_path, RF_TEST_THEN_SINGLE="1"), tmp_path)
    assert "'completed', 6)" in proc.stdout and "'completed', 12)" in proc.stdout
    # Gang runs train on FSDP shards, single runs on whole tensors.
    for run in ("run-0", "run-2"):
        assert f"weights of {run}: ['DTensor']" in proc.stdout
    for run in ("run-1", "run-3"):
        assert f"weights of {run}: ['Parameter']" in proc.stdout
    _assert_equal_to_references(out, references)
    rows = (out / "schedule.csv").read_text().splitlines()[1:]
    chunks = [row.split(",")[0] for row in rows]
    assert sorted(chunks) == sorted([f"run-{i}" for i in range(4)] * 3)  # each chunk once
    # The gang runs did not wait for the single runs to finish: they interleave.
    first_single_end = max(i for i, r in enumerate(chunks) if r in ("run-1", "run-3"))
    assert min(i for i, r in enumerate(chunks) if r in ("run-0", "run-2")) < first_single_end
    # The launch's next experiment, single-device runs only, trains as plain TRL alone does:
    # whole tensors, no trace of the gang's world.
    assert "next: {'run-0': ('completed', 12), 'run-1': ('completed', 12)}" in proc.stdout
    for run, folder in (("run-0", "single-1e-3"), ("run-1", "single-3e-3")):
        assert f"weights of {run}: ['Parameter']" in proc.stdout
        got = load_file(Path(f"{out}-next") / "runs" / run / "final" / "adapter_model.safetensors")
        want = load_file(references / folder / "final" / "adapter_model.safetensors")
        assert all(torch.equal(got[k], want[k]) for k in want), f"next experiment {run} differs"


@pytest.mark.slow
def test_a_gang_run_stopped_mid_flight_resumes_exactly(references, tmp_path):
    out = tmp_path / "exp"
    proc = _run([*ACCELERATE, str(SCRIPT), "rf", str(out)],
                _env(tmp_path, RF_TEST_STOP="run-0:3"), tmp_path)
    said = [line for line in proc.stdout.splitlines() if "after stop" in line]
    assert "after stop: {'run-0': ('stopped', 4)" in proc.stdout, said
    ops = (out / "ops.csv").read_text()
    assert "run-0,stop,ok: stopped at step 4" in ops and "run-0,resume,ok: resumed" in ops
    _assert_equal_to_references(out, references)


@pytest.mark.slow
def test_a_kill_mid_gang_chunk_resumes_exactly_from_per_shard_checkpoints(references, tmp_path):
    out = tmp_path / "exp"
    sharded = {"RF_TEST_STATE_DICT": "SHARDED_STATE_DICT"}
    _run([*ACCELERATE, str(SCRIPT), "rf", str(out)],
         _env(tmp_path, RF_TEST_KILL="run-0:3", **sharded), tmp_path, expect_kill=True)
    assert not (out / "runs" / "run-0" / "final").exists()
    # The boundary checkpoint it resumes from: weights and moments one file per shard.
    ckpt = out / ".rapidfire" / "checkpoints" / "run-0" / "checkpoint-2"
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (ckpt / folder).glob("*.distcp")) == \
            ["__0_0.distcp", "__1_0.distcp"]
    _run([*ACCELERATE, str(SCRIPT), "rf", str(out)], _env(tmp_path, **sharded), tmp_path)
    _assert_equal_to_references(out, references)


def _states(stdout: str) -> dict[tuple[str, int], tuple[str, str, float]]:
    """``(run, step) -> (weights digest, moments digest, learning rate)`` from the script."""
    found = re.findall(r"state of (run-\d+) at step (\d+): weights (\w+) moments (\w+) lr (\S+)",
                       stdout)
    return {(run, int(step)): (w, m, float(lr)) for run, step, w, m, lr in found}


@pytest.mark.slow
def test_a_warm_clone_of_a_gang_run_starts_from_its_shards_with_its_own_schedule(
    references, tmp_path
):
    out = tmp_path / "exp"
    proc = _run([*ACCELERATE, str(SCRIPT), "rf", str(out)],
                _env(tmp_path, RF_TEST_CLONE="run-0:3", RF_TEST_STATE_DICT="SHARDED_STATE_DICT"),
                tmp_path)
    ops = (out / "ops.csv").read_text()
    assert "ok: created run-4 warm-started from run-0" in ops
    assert "error: run-0: a warm start between an FSDP run and a single-device run" in ops
    assert "'run-4': ({'learning_rate': 0.002, 'fsdp': 'full_shard auto_wrap'}, " \
           "'completed', 6)" in proc.stdout
    states = _states(proc.stdout)
    # Asked for during run-0's second chunk, made at its end (step 4): the clone's first step
    # starts from run-0's gathered weights and Adam moments there ...
    assert states[("run-4", 0)][:2] == states[("run-0", 4)][:2]
    assert states[("run-4", 0)][:2] != states[("run-0", 2)][:2]
    # ... with its own learning rate and schedule: linear warm-up from 0 over 2 steps to 2e-3,
    # then down to 0 at step 6 (run-0's own rate at step 4 was 5e-4).
    assert [states[("run-4", s)][2] for s in range(6)] == \
        pytest.approx([0, 1e-3, 2e-3, 1.5e-3, 1e-3, 5e-4])
    assert states[("run-0", 4)][2] == pytest.approx(5e-4)
    # The runs it was cloned among still end as plain TRL would have trained them.
    _assert_equal_to_references(out, references)


def test_an_fsdp_run_outside_a_launch_is_refused_before_anything_trains(tmp_path, monkeypatch):
    from trl_rapidfire import List, RFConfigError, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import cpu_training_kwargs, make_sft_dataset, tiny_lora_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List([1e-3, 3e-3]),
                         fsdp="full_shard auto_wrap", num_chunks=2, **cpu_training_kwargs())
    with pytest.raises(RFConfigError, match=r"run-0 sets fsdp: .*accelerate launch"):
        RFSFTTrainer(model=tiny_model_path(), args=config, train_dataset=make_sft_dataset(16),
                     peft_config=tiny_lora_config(r=4))
    assert not (tmp_path / "exp" / "runs").exists()


@pytest.mark.slow
def test_the_fsdp_example_runs_under_a_launch(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "sft_fsdp.py"
    proc = _run([*ACCELERATE, str(example), "--rows", "32", "--num-chunks", "2",
                 "--output-dir", str(tmp_path / "exp")], _env(tmp_path), tmp_path)
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("run-")]
    assert [(r[0], r[1]) for r in lines] == [("run-0", "lite"), ("run-1", "large"),
                                             ("run-2", "lite"), ("run-3", "large")]
    assert all(r[3] == "4" for r in lines)  # 32 rows / (4 a batch x 2 workers)
    assert "'cpu_offload': True" in proc.stdout  # the seed's offload_params, mapped
    # Without fsdp_on_cpu() nothing is sharded on a CPU: said, not silently ignored.
    assert "No GPU: accelerate selects FSDP only on GPUs" in proc.stderr
    assert "has no effect (cpu_offload included)" in proc.stderr
    for run in ("run-0", "run-1", "run-2", "run-3"):
        assert (tmp_path / "exp" / "runs" / run / "final" / "adapter_model.safetensors").exists()


@pytest.mark.slow
def test_a_users_fsdp_runs_on_a_cpu_launch_train_as_plain_trl_does_there(tmp_path):
    # No fsdp_on_cpu(): the user's settings for a CPU launch (use_cpu, gloo). Plain TRL then
    # trains an FSDP config data-parallel; so must its run here, bitwise, beside a run without
    # fsdp (the RF config checks its FSDP candidate in the launch's world).
    plain = _run([*ACCELERATE, str(SCRIPT), "user-plain", str(tmp_path / "plain")],
                 _env(tmp_path), tmp_path)
    assert "plain wrapped in DistributedDataParallel" in plain.stdout
    rf = _run([*ACCELERATE, str(SCRIPT), "user-rf", str(tmp_path / "rf")], _env(tmp_path),
              tmp_path)
    assert "{'run-0': ('completed', 3), 'run-1': ('completed', 3)}" in rf.stdout
    assert "run-0 wrapped in DistributedDataParallel" in rf.stdout
    want = load_file(tmp_path / "plain" / "final" / "adapter_model.safetensors")
    got = load_file(tmp_path / "rf" / "runs" / "run-0" / "final" / "adapter_model.safetensors")
    assert all(torch.equal(want[k], got[k]) for k in want)
