"""``trl-rapidfire dashboard`` in a process of its own, for the tests that start it as a person
does and read what it prints."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

STARTUP = 300  # seconds: a busy CI machine takes a while to start mlflow server


def env_without_uri(**extra: str) -> dict[str, str]:
    """This process's environment without ``MLFLOW_TRACKING_URI`` (the command is given its
    store), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(extra)
    return env


class Dashboard:
    """``trl-rapidfire dashboard`` in a process of its own, its output read as it comes."""

    def __init__(self, args: list[str], cwd: Path, log: Path) -> None:
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trl_rapidfire.client.cli", "dashboard", *args], cwd=cwd,
            env=env_without_uri(), stdout=subprocess.PIPE, stderr=self._log, text=True,
            start_new_session=True)  # the test, not a terminal, signals it
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def printed(self, prefix: str) -> str:
        """The URL of the next line starting with ``prefix`` (``"MLflow UI: "``, ``"Control
        panel: "``)."""
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"the dashboard ended: {self.proc.returncode}"
                continue
            if line.startswith(prefix):
                return line[len(prefix):].split()[0]
        pytest.fail(f"the dashboard never printed {prefix!r}")

    def url(self) -> str:
        """The URL of the line that says the UI answers."""
        return self.printed("MLflow UI: ")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._log.close()
