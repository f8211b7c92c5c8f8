"""A real ``mlflow server`` for the tests that go through its REST API or its UI."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the server at ``url`` answers ``/health`` (fails if ``proc`` ends first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the server at {url} did not start")
        time.sleep(0.5)


@contextlib.contextmanager
def mlflow_server(db: Path, app_name: str | None = None) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1 (one worker, no job runner, sqlite at ``db``, with the
    app plugin ``app_name`` if given), as the dashboard command starts it; yields its URL once
    ``/health`` answers, stops it after."""
    port = free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         *(["--app-name", app_name] if app_name else [])],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
