"""Many workers and crash safety, end to end, in real processes.

Every experiment here is ``tests/experiment_script.py`` (4 LoRA configs x 3 chunks) run as a
user runs it: ``python script.py`` or ``accelerate launch --multi_gpu --num_processes 2``.
All processes use one thread (``OMP_NUM_THREADS=1``): bitwise equality holds at a fixed
thread count. The reference is the same script run once, uninterrupted, by one process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from launched import launch_env, loss_history
from safetensors.torch import load_file

from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.storage.schedule import read_schedule_csv
from trl_rapidfire.testing import tiny_model_path

pytestmark = pytest.mark.slow

SCRIPT = (Path(__file__).resolve().parents[1] / "experiment_script.py")
RUNS = [f"run-{i}" for i in range(4)]
CHUNKS = 3
ACCELERATE = [
    sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
    "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return launch_env(tmp, **extra)


def _run(cmd: list[str], env: dict[str, str], cwd: Path, *, expect_kill: bool = False,
         timeout: float = 600) -> subprocess.CompletedProcess:
    # A session of its own: a kill of the experiment's process group kills only it.
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)
    if expect_kill:
        assert proc.returncode != 0, "the experiment was meant to be killed"
    else:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _script(out: Path, workers: int) -> list[str]:
    prefix = ACCELERATE if workers == 2 else [sys.executable]
    return [*prefix, str(SCRIPT), str(out)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The experiment run once by one process, never interrupted."""
    tiny_model_path()  # built once, before processes race to build it
    tmp = tmp_path_factory.mktemp("reference")
    _run(_script(tmp / "exp", 1), _env(tmp, RF_TEST_REPORT_TO="mlflow"), tmp)
    return tmp / "exp"


def _assert_same_adapters(a: Path, b: Path) -> None:
    for run in RUNS:
        wa = load_file(a / "runs" / run / "final" / "adapter_model.safetensors")
        wb = load_file(b / "runs" / run / "final" / "adapter_model.safetensors")
        assert wa.keys() == wb.keys()
        for key in wa:
            assert torch.equal(wa[key], wb[key]), f"{run}: {key} differs"


def _assert_each_chunk_once(out: Path) -> list:
    rows = read_schedule_csv(out / "schedule.csv")
    counts = Counter((r.run, r.number) for r in rows)
    assert set(counts) == {(run, n) for run in RUNS for n in range(CHUNKS)}
    assert all(c == 1 for c in counts.values()), counts
    return rows


def _loss_history(tmp: Path, exp: str) -> dict[str, list[tuple[int, float]]]:
    return loss_history(f"sqlite:///{tmp / 'mlflow.db'}", exp)


def test_two_workers_under_accelerate_launch_equal_one_process_bitwise(reference, tmp_path):
    out = tmp_path / "exp"
    _run(_script(out, 2), _env(tmp_path), tmp_path)
    rows = _assert_each_chunk_once(out)
    assert not (out / "ops.csv").exists()
    _assert_same_adapters(reference, out)
    # Task parallel: the two workers' chunks overlap in time. On a loaded 2-core machine the
    # second worker is now and then ready only after the first trained all 12 short chunks
    # (seen once in four suite runs): then there is no overlap to see. Both workers training
    # is asserted with longer chunks in test_an_op_from_the_script_applies_once_with_two_workers
    # and tests/engine/test_several_machines.py.
    workers = {r.worker for r in rows}
    assert workers <= {0, 1} and 0 in workers
    if workers == {0, 1}:
        spans = {w: (min(r.start_time for r in rows if r.worker == w),
                     max(r.end_time for r in rows if r.worker == w)) for w in (0, 1)}
        assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]


@pytest.mark.parametrize("workers, every", [(1, ""), (2, "2 chunks")])
def test_kill_9_mid_chunk_then_rerun_finishes_bitwise_with_one_point_per_step(
    reference, tmp_path, workers, every
):
    out = tmp_path / "exp"
    env = _env(tmp_path, RF_TEST_REPORT_TO="mlflow", RF_TEST_CHECKPOINT_EVERY=every)
    # run-1's second chunk covers steps 8-16: step 12 is mid-chunk. With checkpoint_every
    # at its default (60 s) every boundary before it is volatile; with "2 chunks" a run that
    # finished its second chunk (boundary 16) has it on disk.
    # With two workers the other one may still be training its second chunk (or writing it)
    # when run-1 reaches step 12: the kill waits until a boundary is durable.
    kill = "run-1:12:durable" if every else "run-1:12"
    _run(_script(out, workers), {**env, "RF_TEST_KILL": kill}, tmp_path, expect_kill=True)
    before = read_schedule_csv(out / "schedule.csv")
    assert ("run-1", 1) not in {(r.run, r.number) for r in before}
    assert len(before) < len(RUNS) * CHUNKS
    state = FileStore(out / ".rapidfire", "", create=False).read()
    durable = {run: state.runs[run].durable_chunks for run in RUNS}
    assert any(state.runs[run].volatile for run in RUNS)  # chunks that the kill loses
    if every:
        assert any(durable.values())

    rerun_at = time.time()
    _run(_script(out, workers), env, tmp_path)
    rows = _assert_each_chunk_once(out)
    # The lost chunks were trained again, once, and nothing durable was.
    again = Counter((r.run, r.number) for r in rows if r.start_time >= rerun_at)
    assert again == {(run, n): 1 for run in RUNS for n in range(durable[run], CHUNKS)}
    _assert_same_adapters(reference, out)
    # MLflow: exactly one loss point per step, equal to the uninterrupted run's.
    ref_tmp = reference.parent
    assert _loss_history(tmp_path, "exp") == _loss_history(ref_tmp, "exp")


def test_an_op_from_the_script_applies_once_with_two_workers(tmp_path):
    out = tmp_path / "exp"
    # Chunks long enough (40 steps) that the second worker, which starts later, gets some:
    # with 8-step chunks the first worker could finish all 9 before the second is ready.
    _run(_script(out, 2), _env(tmp_path, RF_TEST_STOP="run-2", RF_TEST_ROWS="480"), tmp_path)
    ops = (out / "ops.csv").read_text().strip().splitlines()
    assert len(ops) == 2 and ",stop," in ops[1] and "ok: stopped" in ops[1], ops
    rows = read_schedule_csv(out / "schedule.csv")
    # Ops the script queues before train() apply before any worker trains.
    assert {r.run for r in rows} == {"run-0", "run-1", "run-3"}
    assert len(rows) == 3 * CHUNKS and {r.worker for r in rows} == {0, 1}
    assert not (out / "runs" / "run-2" / "final").exists()


def test_a_process_killed_mid_chunk_is_refused_company_then_its_rerun_redoes_its_chunks(
        reference, tmp_path):
    # One experiment trains in a folder at a time (docs/security.md): a second plain process
    # started while the first trains is refused at once, naming it. The first is then
    # killed mid-chunk; its re-run redoes what it trained since its runs' last durable
    # boundaries (with checkpoint_every at its default every boundary of these short runs is
    # volatile: all of it) and finishes every run as plain TRL would.
    out = tmp_path / "exp"
    env = _env(tmp_path, RF_TEST_ROWS="96")
    doomed = subprocess.Popen(_script(out, 1), env={**env, "RF_TEST_KILL": "any:12:peer"},
                              cwd=tmp_path, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not (out / "schedule.csv").exists() or len(
                read_schedule_csv(out / "schedule.csv")) < 1:
            assert time.time() < deadline and doomed.poll() is None
            time.sleep(0.2)
        # It waits at step 12 for a peer that never comes: it trains while the second starts.
        second = subprocess.run(_script(out, 1), env=env, cwd=tmp_path, capture_output=True,
                                text=True, timeout=600)
        assert second.returncode != 0
        assert f"process {doomed.pid} on" in second.stderr, second.stderr[-3000:]
        assert doomed.poll() is None
    finally:
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=60)
    rerun = subprocess.run(_script(out, 1), env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    _assert_each_chunk_once(out)
    _assert_same_adapters(reference, out)


def test_rerun_with_other_configs_under_a_launch_is_refused_before_training(reference, tmp_path):
    # Alone, a process moves the other experiment aside (test_resume.py); under a launch
    # every worker would, so it is refused.
    out = tmp_path / "exp"
    shutil.copytree(reference, out)
    env = _env(tmp_path, RF_TEST_ROWS="64")  # other data: another experiment
    proc = subprocess.run(_script(out, 2), env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0
    assert "belongs to an experiment with other runs" in proc.stderr
    assert read_schedule_csv(out / "schedule.csv") == read_schedule_csv(
        reference / "schedule.csv")


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    try:  # a zombie (exited, not yet reaped by its new parent) has stopped too
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_whose_launcher_died_stop_at_their_next_boundary(tmp_path):
    # The launcher alone is killed (its workers orphaned): they must not train on beside a
    # re-run. They stop at their next chunk boundary; the re-run trains every chunk once.
    out = tmp_path / "exp"
    env = _env(tmp_path, RF_TEST_ROWS="960")  # 80-step chunks: seconds each
    log = (tmp_path / "launch.log").open("w")
    launcher = subprocess.Popen(_script(out, 2), env=env, cwd=tmp_path, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=log)
    workers: list[int] = []
    try:
        deadline = time.time() + 300
        while not (out / "schedule.csv").exists() or not read_schedule_csv(out / "schedule.csv"):
            assert time.time() < deadline and launcher.poll() is None
            time.sleep(0.2)
        workers = _children_of(launcher.pid)
        assert len(workers) == 2, workers
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.time() + 120
        while any(_running(pid) for pid in workers):
            assert time.time() < deadline, "orphaned workers kept training"
            time.sleep(0.2)
    finally:
        log.close()
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    assert "its launcher (pid" in (tmp_path / "launch.log").read_text()
    before = read_schedule_csv(out / "schedule.csv")
    assert len(before) < len(RUNS) * CHUNKS
    _run(_script(out, 1), env, tmp_path)
    _assert_each_chunk_once(out)
