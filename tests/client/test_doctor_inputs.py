"""``trl-rapidfire doctor`` on inputs no store or folder can be: each is a finding that names the
variable or option (with its fix), never a traceback or an abort without saying which."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_rapidfire.client import doctor

EXE = Path(sys.executable).with_name("trl-rapidfire")


def _doctor(tmp_path: Path, uri: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(MLFLOW_TRACKING_URI=uri, HF_HOME=str(tmp_path / "hf"))
    return subprocess.run([str(EXE), "doctor", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("uri", ["sqlite:///a%00b.db", "file:///tmp/x%00y", "/tmp/x%00y",
                                 "http://127.0.0.1:9/%00"])
def test_a_nul_byte_in_the_tracking_uri_is_a_finding_naming_the_variable(uri):
    _, reachable = doctor.check_tracking(uri)
    assert reachable.value == "no"
    assert "NUL" in reachable.problem and "MLFLOW_TRACKING_URI" in reachable.problem + \
        reachable.fix


@pytest.mark.parametrize("uri", ["sqlite:///:memory:", "sqlite://", "sqlite+pysqlite:///:memory:",
                                 "sqlite:///file::memory:?cache=shared"])
def test_an_in_memory_sqlite_store_is_refused(uri):
    _, reachable = doctor.check_tracking(uri)
    assert reachable.value == "no" and "in-memory" in reachable.problem
    assert reachable.fix.startswith("set MLFLOW_TRACKING_URI to")


def test_a_symlink_loop_as_output_dir_is_a_finding_naming_the_option(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    [finding] = doctor.check_disk(loop / "sub")
    assert finding.label == "output_dir" and "loop of symbolic links" in finding.problem
    assert "--output-dir" in finding.fix


def test_the_command_reports_each_instead_of_a_traceback(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for uri, said in (("sqlite:///a%00b.db", "NUL byte"), ("sqlite:///:memory:", "in-memory")):
        done = _doctor(tmp_path, uri, "--output-dir", str(loop / "sub"))
        assert done.returncode == 1 and not done.stderr, done.stderr
        screen = " ".join(done.stdout.split())  # as one line: the screen wraps at 100
        assert said in screen and "MLFLOW_TRACKING_URI" in screen
        assert "output_dir" in screen and "loop of symbolic links" in screen
