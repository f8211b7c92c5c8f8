"""Rough edge: ``accelerate launch --num_processes 2 script.py`` on a machine without GPUs
starts the script once (accelerate's simple launcher), so the experiment trains with one
worker. It is now said, with the fix; a real multi-worker launch says nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from trl_rapidfire.runtime.workers import _asked_processes

_PROBE = textwrap.dedent("""
    from trl_rapidfire.runtime.workers import one_worker_warning
    print("PROBE:", one_worker_warning())
""")


def test_reads_num_processes_from_the_launch_options_only():
    launch = ["/venv/bin/python", "/venv/bin/accelerate", "launch"]
    assert _asked_processes([*launch, "--num_processes", "2", "train.py"]) == 2
    assert _asked_processes([*launch, "--num-processes=4", "--cpu", "train.py"]) == 4
    assert _asked_processes([*launch, "train.py", "--num_processes", "3"]) is None  # script's
    assert _asked_processes([*launch, "-m", "pkg", "--num_processes", "3"]) is None
    assert _asked_processes(["python", "train.py", "launch", "--num_processes", "2"]) is None
    assert _asked_processes(["bash", "-c", "x"]) is None
    module = ["python", "-m", "accelerate.commands.launch", "--num_processes", "2", "t.py"]
    assert _asked_processes(module) == 2


def _launch(tmp_path, *options: str) -> subprocess.CompletedProcess:
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    # No accelerate config (HF_HOME is where `accelerate launch` looks for its default one: a
    # developer's own could ask for MULTI_GPU) and no GPU (with 2+ accelerate turns multi_gpu
    # on by itself): the CPU launch a person makes here.
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf-home"), CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        # As a person types it: the `accelerate` command, then `launch`.
        [os.path.join(os.path.dirname(sys.executable), "accelerate"), "launch", *options,
         str(script)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="reads /proc")
def test_a_launch_that_started_one_process_says_so_and_how_to_fix_it(tmp_path):
    done = _launch(tmp_path, "--num_processes", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    probes = [line for line in done.stdout.splitlines() if line.startswith("PROBE:")]
    assert len(probes) == 1  # one process: the trap itself
    assert "asked for 2 processes" in probes[0] and "--multi_gpu --num_processes 2" in probes[0]


@pytest.mark.slow
def test_a_real_two_worker_launch_says_nothing(tmp_path):
    done = _launch(tmp_path, "--multi_gpu", "--num_processes", "2",
                   "--main_process_port", "0")
    assert done.returncode == 0, done.stderr[-2000:]
    probes = [line for line in done.stdout.splitlines() if line.startswith("PROBE:")]
    assert probes == ["PROBE: None", "PROBE: None"]
