"""scripts/installed.py: install.sh skips pip only when nothing is missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "scripts" / "installed.py")],
                          capture_output=True, text=True, timeout=60)


def test_this_environment_needs_nothing():
    out = _check(ROOT)
    assert out.returncode == 0, out.stdout


def test_a_missing_version_or_another_checkout_means_install(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "installed.py", tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "constraints.txt").write_text("filelock==0.0.1\n")
    out = _check(tmp_path)
    assert out.returncode == 1 and "filelock" in out.stdout and "0.0.1" in out.stdout
    # Said as what install.sh does next, not as an error.
    assert out.stdout.startswith("install: installing with pip (")
    shutil.copy(ROOT / "constraints.txt", tmp_path)
    out = _check(tmp_path)  # everything is there, but installed from another folder
    assert out.returncode == 1 and "not this checkout" in out.stdout


def test_install_sh_reads_torchs_version_without_importing_it():
    # Importing torch before numpy is installed warns "Failed to initialize NumPy".
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert "import torch" not in script and 'm.version("torch")' in script
