"""One experiment over two machines: ``accelerate launch --num_machines 2`` on one host, the
second machine's launcher in a UTS namespace of its own (``unshare --uts``, another hostname),
both sharing one ``output_dir`` as a cluster's shared filesystem would.

The experiment is ``tests/experiment_script.py`` (4 LoRA configs x 3 chunks); every process
uses one thread, and the reference is the same script run once by one process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from launched import GANG_RUNS, GANG_SCRIPT, launch_env, loss_history, train_gang_references
from mlflow_server import free_port, mlflow_server
from safetensors.torch import load_file

from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.storage.schedule import read_schedule_csv
from trl_rapidfire.testing import tiny_model_path
from trl_rapidfire.tracking.tags import check_uri_across_machines

SCRIPT = (Path(__file__).resolve().parents[1] / "experiment_script.py")
RUNS = [f"run-{i}" for i in range(4)]
CHUNKS = 3


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return launch_env(tmp, **extra)


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--uts", "--fork", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _machine(rank: int, port: int, out: Path, env: dict[str, str], cwd: Path,
             processes: int = 2, script: tuple[str, ...] | None = None) -> subprocess.Popen:
    """Machine ``rank``'s ``accelerate launch`` (``processes`` workers) of ``script`` (the
    experiment script on ``out`` by default), as node<rank>."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
              "--num_processes", str(2 * processes), "--num_machines", "2",
              "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
              "--main_process_port", str(port), "--mixed_precision", "no",
              "--dynamo_backend", "no", *(script or (str(SCRIPT), str(out)))]
    cmd = ["unshare", "--uts", "--fork", "sh", "-c", f'hostname node{rank} && exec "$@"', "sh",
           *launch]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _both(tmp: Path, out: Path, env: dict[str, str], timeout: float = 900,
          **machine: object) -> list:
    port = free_port()
    procs = [_machine(rank, port, out, env, tmp, **machine) for rank in (0, 1)]
    results = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                os.killpg(p.pid, 9)
            raise
        results.append((proc.returncode, stdout, stderr))
    return results


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (torchrun starts each worker in a session of its
    own, so a process group does not reach them)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        todo.extend(int(c) for c in children)
    return out


def _machine_1_training(out: Path) -> bool:
    """Whether a worker of machine 1 (host node1) holds a claim in the shared state now."""
    from trl_rapidfire.shared_state.state_file import FileStore

    if not (out / ".rapidfire").is_dir():
        return False
    try:
        state = FileStore(out / ".rapidfire", "", create=False).peek()
    except Exception:  # noqa: BLE001 - being written: look again
        return False
    return state is not None and any(c.worker.startswith("node1:")
                                     for c in state.claims.values())


def _kill_tree(proc: subprocess.Popen) -> None:
    for pid in _tree(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_lease_comes_from_the_environment(monkeypatch):
    from trl_rapidfire.shared_state.worker_info import LEASE_VARIABLE, lease_seconds

    monkeypatch.delenv(LEASE_VARIABLE, raising=False)
    assert lease_seconds() == 120.0
    monkeypatch.setenv(LEASE_VARIABLE, "15")
    assert lease_seconds() == 15.0
    for bad in ("soon", "1", "-5", "inf", "nan"):
        monkeypatch.setenv(LEASE_VARIABLE, bad)
        with pytest.raises(ValueError, match=LEASE_VARIABLE):
            lease_seconds()


def test_the_launch_identity_comes_from_the_rendezvous_store(monkeypatch):
    from datetime import timedelta

    from torch.distributed import TCPStore

    from trl_rapidfire.runtime.workers import _launch_identity, _machines

    port = free_port()
    # What torchrun's agent on machine 0 hosts, and what it tells every worker.
    server = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = _launch_identity(0)
    assert _launch_identity(3) == first  # another worker, on any machine, reads the same
    assert first.startswith(f"127.0.0.1:{port}:")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the worker group restarted
    again = _launch_identity(0)
    assert again != first and _launch_identity(1) == again
    del server
    # Without a rendezvous store: the launcher's pid on this host (one machine only).
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    assert _launch_identity(1) == f"{socket.gethostname()}:{os.getppid()}:" + os.environ.get(
        "TORCHELASTIC_RUN_ID", "")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert _machines(8) == 2
    monkeypatch.delenv("GROUP_WORLD_SIZE")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _machines(8) == 2 and _machines(4) == 1


def test_a_folder_that_cannot_lock_stops_the_experiment_before_anything_trains(
        tmp_path, monkeypatch):
    # NFS without lock support answers flock with ENOLCK. No such mount can be made here, so
    # flock answers as it would there; everything else is real.
    import errno
    import fcntl

    import trl_rapidfire.shared_state.flock as flock_module
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.shared_state.flock import LockUnsupported
    from trl_rapidfire.testing import cpu_training_kwargs, make_sft_dataset, tiny_lora_config

    real_flock = fcntl.flock

    def no_locks(fd, operation):
        if operation & fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        return real_flock(fd, operation)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(flock_module.fcntl, "flock", no_locks, raising=True)
    out = tmp_path / "exp"
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         per_device_train_batch_size=4, **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4))
    with pytest.raises(LockUnsupported, match="cannot lock files") as err:
        trainer.train()
    assert "NFSv4" in str(err.value) and str(out) in str(err.value)
    assert not (out / "runs").exists() or not any((out / "runs").glob("*/final"))
    assert not (out / "schedule.csv").exists()


def test_a_sqlite_store_is_refused_across_machines_and_a_server_is_not():
    check_uri_across_machines("sqlite:///x/mlflow.db", 1)  # one machine: fine
    check_uri_across_machines("http://127.0.0.1:5000", 2)
    for uri in ("sqlite:////shared/mlflow.db", "file:///shared/mlruns", "/shared/mlruns"):
        with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI=http://") as err:
            check_uri_across_machines(uri, 2)
        assert "2 machines" in str(err.value) and uri in str(err.value)


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare --uts` (root, or user "
                    "namespaces) to give the second machine its own hostname")
def test_two_machines_share_one_experiment_bitwise(tmp_path):
    # 8 LoRA configs (2 learning rates x 2 schedules x 2 ranks) x 3 chunks x 2 epochs, tracked
    # through a real tracking server, as a cluster would run it.
    tiny_model_path()  # built once, before processes race to build it
    runs = [f"run-{i}" for i in range(8)]
    out, reference = tmp_path / "exp", tmp_path / "reference"
    with mlflow_server(tmp_path / "server.db") as url:
        extra = dict(RF_TEST_RANKS="4,8", RF_TEST_EPOCHS="2", RF_TEST_REPORT_TO="mlflow",
                     MLFLOW_TRACKING_URI=url)
        subprocess.run([sys.executable, str(SCRIPT), str(reference)],
                       env=_env(tmp_path, **extra), cwd=tmp_path, check=True,
                       capture_output=True, timeout=600)
        results = _both(tmp_path, out, _env(tmp_path, **extra))
        for code, stdout, stderr in results:
            assert code == 0, stdout[-2000:] + stderr[-5000:]
        # One point per step for every run, the values the single process logged.
        assert loss_history(url, "exp") == loss_history(url, "reference")
    rows = read_schedule_csv(out / "schedule.csv")
    counts = Counter((r.run, r.epoch, r.number) for r in rows)
    assert {(run, n) for run, _, n in counts} == {(run, n) for run in runs
                                                  for n in range(2 * CHUNKS)}
    assert all(c == 1 for c in counts.values()), counts
    workers = {r.worker for r in rows}
    assert workers & {0, 1} and workers & {2, 3}, f"both machines must train: {workers}"
    for run in runs:
        a = load_file(reference / "runs" / run / "final" / "adapter_model.safetensors")
        b = load_file(out / "runs" / run / "final" / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), run


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare --uts` (root, or user "
                    "namespaces) to give the second machine its own hostname")
def test_two_machines_with_a_sqlite_store_stop_before_training(tmp_path):
    tiny_model_path()
    out = tmp_path / "exp"
    results = _both(tmp_path, out, _env(tmp_path, RF_TEST_REPORT_TO="mlflow"), timeout=600)
    assert all(code != 0 for code, _, _ in results)
    assert any("is not safe" in stderr and "MLFLOW_TRACKING_URI" in stderr
               for _, _, stderr in results)
    assert not (out / "schedule.csv").exists() or not read_schedule_csv(out / "schedule.csv")


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare --uts` (root, or user "
                    "namespaces) to give the second machine its own hostname")
def test_a_machine_killed_mid_experiment_leaves_the_other_to_finish_bitwise(tmp_path):
    tiny_model_path()
    rows = "480"  # 40 steps a chunk: the kill lands while chunks are in flight
    reference = tmp_path / "reference"
    subprocess.run([sys.executable, str(SCRIPT), str(reference)],
                   env=_env(tmp_path, RF_TEST_ROWS=rows), cwd=tmp_path, check=True,
                   capture_output=True, timeout=600)
    out = tmp_path / "exp"
    env = _env(tmp_path, RF_TEST_ROWS=rows, TRL_RAPIDFIRE_LEASE_SECONDS="8")
    port = free_port()
    machines = [_machine(rank, port, out, env, tmp_path) for rank in (0, 1)]
    finals = [out / "runs" / run / "final" / "adapter_model.safetensors" for run in RUNS]
    try:
        # Machine 1 dies (every process of it, at once) while it trains a chunk.
        deadline = time.time() + 600
        while time.time() < deadline and not _machine_1_training(out):
            assert machines[1].poll() is None, machines[1].communicate()[1][-3000:]
            time.sleep(0.1)
        _kill_tree(machines[1])
        killed_at = len(read_schedule_csv(out / "schedule.csv"))
        assert killed_at < len(RUNS) * CHUNKS, "machine 1 died too late to matter"
        # Machine 0's workers finish every run (its launcher may wait for the lost machine at
        # exit, as torchrun does: the finished runs are what counts).
        while time.time() < deadline and not all(f.exists() for f in finals):
            assert machines[0].poll() in (None, 0), machines[0].communicate()[1][-3000:]
            time.sleep(0.5)
        assert all(f.exists() for f in finals), "machine 0 did not finish every run"
    finally:
        for proc in machines:
            _kill_tree(proc)
            proc.communicate()
    rows_done = read_schedule_csv(out / "schedule.csv")
    counts = Counter((r.run, r.number) for r in rows_done)
    assert set(counts) == {(run, n) for run in RUNS for n in range(CHUNKS)}
    assert all(c == 1 for c in counts.values()), counts  # a lost chunk is recorded once
    after = rows_done[killed_at:]
    assert after and all(r.worker in (0, 1) for r in after)
    for run in RUNS:
        a = load_file(reference / "runs" / run / "final" / "adapter_model.safetensors")
        b = load_file(out / "runs" / run / "final" / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), run


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare --uts` (root, or user "
                    "namespaces) to give the second machine its own hostname")
def test_both_machines_killed_then_rerun_continue_bitwise_through_a_tracking_server(tmp_path):
    tiny_model_path()
    rows = "480"
    out, reference = tmp_path / "exp", tmp_path / "reference"
    with mlflow_server(tmp_path / "server.db") as url:
        # The reference, one process, tracked to the same server under its own experiment.
        subprocess.run([sys.executable, str(SCRIPT), str(reference)],
                       env=_env(tmp_path, RF_TEST_ROWS=rows, RF_TEST_REPORT_TO="mlflow",
                                MLFLOW_TRACKING_URI=url),
                       cwd=tmp_path, check=True, capture_output=True, timeout=600)
        env = _env(tmp_path, RF_TEST_ROWS=rows, RF_TEST_REPORT_TO="mlflow",
                   MLFLOW_TRACKING_URI=url, TRL_RAPIDFIRE_LEASE_SECONDS="8")
        port = free_port()
        machines = [_machine(rank, port, out, env, tmp_path) for rank in (0, 1)]
        try:
            deadline = time.time() + 600
            while time.time() < deadline:  # a few chunks recorded, others in flight
                done = read_schedule_csv(out / "schedule.csv") \
                    if (out / "schedule.csv").exists() else []
                if len(done) >= 2:
                    break
                assert all(m.poll() is None for m in machines), "a machine ended early"
                time.sleep(0.1)
        finally:
            for proc in machines:  # kill -9 of every process of both machines
                _kill_tree(proc)
            for proc in machines:
                proc.communicate()
        before = read_schedule_csv(out / "schedule.csv")
        assert 0 < len(before) < len(RUNS) * CHUNKS, "the kill must land mid-experiment"
        # checkpoint_every (60 s) left these chunks volatile, except where a run was handed
        # from one machine to the other: the kill loses them, the re-run trains them again.
        state = FileStore(out / ".rapidfire", "", create=False).read()
        durable = {run: state.runs[run].durable_chunks for run in RUNS}
        kept = [r for r in before if r.number < durable[r.run]]
        # The same two commands again.
        for code, stdout, stderr in _both(tmp_path, out, env):
            assert code == 0, stdout[-2000:] + stderr[-5000:]
        after = read_schedule_csv(out / "schedule.csv")
        assert after[:len(kept)] == kept  # what was durable stays, and is not redone
        counts = Counter((r.run, r.number) for r in after)
        assert set(counts) == {(run, n) for run in RUNS for n in range(CHUNKS)}
        assert all(c == 1 for c in counts.values()), counts
        for run in RUNS:
            a = load_file(reference / "runs" / run / "final" / "adapter_model.safetensors")
            b = load_file(out / "runs" / run / "final" / "adapter_model.safetensors")
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), run
        # One point per step for every run, the values the uninterrupted run logged.
        assert loss_history(url, "exp") == loss_history(url, "reference")


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare --uts` (root, or user "
                    "namespaces) to give the second machine its own hostname")
def test_an_fsdp_gang_spans_both_machines_bitwise(tmp_path):
    # One worker on each machine: the gang of the launch is both of them (FSDP2 over gloo on
    # loopback), its single-device runs one worker each; against plain TRL, the gang config
    # under a one-machine launch of two processes, the others alone.
    tiny_model_path()
    ref = tmp_path / "references"
    ref.mkdir()
    train_gang_references(ref, _env(tmp_path))
    out = tmp_path / "exp"
    results = _both(tmp_path, out, _env(tmp_path), processes=1,
                    script=(str(GANG_SCRIPT), "rf", str(out)))
    for code, stdout, stderr in results:
        assert code == 0, stdout[-2000:] + stderr[-5000:]
    assert any("weights of run-0: ['DTensor']" in stdout for _, stdout, _ in results)
    rows = read_schedule_csv(out / "schedule.csv")
    assert Counter(r.run for r in rows) == {run: 3 for run in GANG_RUNS}
    for run, (folder, _, _) in GANG_RUNS.items():
        got = load_file(out / "runs" / run / "final" / "adapter_model.safetensors")
        want = load_file(ref / folder / "final" / "adapter_model.safetensors")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), run
