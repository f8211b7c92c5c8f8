"""Every network call of the CLI and ``doctor`` has a total deadline (connect and read), not only
a socket timeout: a tracking server on 127.0.0.1 that sends its answer one byte every 2 s (which
resets any socket timeout over 2 s, forever) gets a clear answer within the documented
seconds from ``doctor``, ``status --uri`` and ``stop --uri``, whether it trickles ``/health``
or only the REST API behind a prompt ``/health``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trl_rapidfire.client import doctor
from trl_rapidfire.client.deadlines import CallTimeout, call_within, fetch_within, shown_url

EXE = Path(sys.executable).with_name("trl-rapidfire")
# Far beyond any deadline here (3 s for /health, 5 s for an API call under the CLI), far below
# forever: a command that is still running then hung on the server.
HUNG_AFTER = 60.0
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nOK"


def _serve(conn: socket.socket, trickle: bool) -> None:
    with conn:
        try:
            conn.settimeout(HUNG_AFTER)
            request = conn.recv(65536)
            if not trickle:
                conn.sendall(ANSWER)
                return
            for byte in ANSWER:  # one byte every 2 s: a 3 s socket timeout never fires
                conn.sendall(bytes([byte]))
                time.sleep(2)
            del request
        except OSError:  # the client gave up and closed: that is the point
            pass


@pytest.fixture
def trickling() -> Iterator[tuple[str, str]]:
    """Two servers on 127.0.0.1: one trickles every answer; the other answers ``/health``
    at once and trickles everything else (the REST API). Their base URLs."""
    listeners, urls = [], []
    for health_prompt in (False, True):
        sock = socket.create_server(("127.0.0.1", 0))
        sock.settimeout(0.2)
        listeners.append(sock)
        urls.append(f"http://127.0.0.1:{sock.getsockname()[1]}")

        def accept(sock: socket.socket = sock, health_prompt: bool = health_prompt) -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except TimeoutError:
                    continue
                except OSError:  # closed at the end of the test
                    return
                peek = conn.recv(64, socket.MSG_PEEK)
                trickle = not (health_prompt and b" /health " in peek)
                threading.Thread(target=_serve, args=(conn, trickle), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
    try:
        yield urls[0], urls[1]
    finally:
        for sock in listeners:
            sock.close()


def _cli(args: list[str], tmp_path: Path, uri: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(MLFLOW_TRACKING_URI=uri, HF_HOME=str(tmp_path / "hf"))
    start = time.monotonic()
    try:
        done = subprocess.run([str(EXE), *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=HUNG_AFTER)
    except subprocess.TimeoutExpired:
        pytest.fail(f"trl-rapidfire {' '.join(args)} still waited on a trickling server after "
                    f"{HUNG_AFTER:.0f} s")
    return time.monotonic() - start, done


def test_doctor_gives_up_on_a_trickling_server_within_its_deadline(trickling, tmp_path):
    slow, _ = trickling
    start = time.monotonic()
    store, reachable = doctor.check_tracking(slow)
    assert time.monotonic() - start < doctor.HTTP_TIMEOUT + 1.5
    assert reachable.value == "no" and "within 3 s" in reachable.problem, reachable
    # And the command as a whole (its torch probe included) answers, naming the server.
    took, done = _cli(["doctor"], tmp_path, slow)
    assert done.returncode == 1, done.stderr
    assert "within 3 s" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [["status"], ["stop", "run-1"]])
@pytest.mark.parametrize("which", ["health", "api"])
def test_status_and_stop_give_up_on_a_trickling_server(trickling, tmp_path, command, which):
    uri = trickling[0] if which == "health" else trickling[1]
    took, done = _cli([*command, "--uri", uri], tmp_path, uri)
    # /health in 3 s, then (a prompt /health) one API call in the CLI's 5 s.
    assert took < 3 + 5 + 10, took
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "within" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "127.0.0.1" in done.stderr


def test_a_total_deadline_is_kept_whatever_the_call_does():
    start = time.monotonic()
    with pytest.raises(CallTimeout, match="no whole answer from the thing within 0.3 s"):
        call_within(0.3, lambda: time.sleep(30), "the thing")
    assert time.monotonic() - start < 2
    assert isinstance(CallTimeout("x"), OSError)  # every "server down" handler takes it
    with pytest.raises(ZeroDivisionError):  # what the call raises is raised as it is
        call_within(5, lambda: 1 / 0, "a sum")


def test_a_timeout_names_the_url_without_its_secrets(trickling):
    slow, _ = trickling
    with pytest.raises(CallTimeout) as caught:
        fetch_within(slow + "/x?token=abc", 0.5)
    assert "abc" not in str(caught.value) and f"{slow}/x within 0.5 s" in str(caught.value)
    assert shown_url("https://me:secret@host:5000/p?token=abc") == "https://host:5000/p"
