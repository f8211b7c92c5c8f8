"""``trl-rapidfire dashboard``: the stock MLflow UI (``mlflow server``) on 127.0.0.1 for the
store in use, with trl-rapidfire's control panel (buttons to stop, resume, delete and clone
runs: :mod:`.panel_app`, MLflow's app plugin) on the same host and port, opened where the runs
are, and stopped with everything it started.

Where it opens: the saved view of MLflow's runs table (:mod:`.mlflow_view`: the child runs
flat, best first by the experiment's ranking metric, the knobs that differ first), written
into each MLflow experiment holding trl-rapidfire runs before the server starts and into each
new one while it serves; the dashboard prints :func:`runs_url`, which opens that view in
"Model training" mode.

Quiet. ``mlflow server`` says a few things at every start that tell a person nothing here
(the registry store it defaults to, its localhost-only security defaults, starlette's
deprecation warning of MLflow's own WSGI middleware, uvicorn's "started" lines): without
``--verbose`` they are dropped (MLflow's notices by their text from the server's output,
which passes through the dashboard; the warning by a ``PYTHONWARNINGS`` filter of its text;
uvicorn's by its log level, ``warning``), so the dashboard's links come right after its own
first line; every other line of the server (a warning, an error, a traceback)
is shown as it comes.

Stopping. The server runs in a session of its own (a Ctrl-C in the terminal reaches the
dashboard only, which stops it); on SIGINT, SIGTERM or SIGHUP (a closed terminal) the
dashboard stops its whole process group and any process of its tree that left the group,
then exits. On Linux the server also gets SIGTERM from the kernel when the dashboard dies
without a word (SIGKILL), which ``mlflow server`` forwards to its uvicorn.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

# The saved view lives in mlflow_view.py; its names stay importable from here.
from .mlflow_view import (
    VIEW_ID,
    VIEW_NAME,
    ensure_all_views,
    ensure_runs_view,
    runs_url,
    runs_view_state,
)

__all__ = [
    "VIEW_ID",
    "VIEW_NAME",
    "ensure_runs_view",
    "landing_url",
    "local_store_path",
    "panel_url",
    "runs_url",
    "runs_view_state",
    "serve",
    "stop_server",
]

_STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP")
                      if hasattr(signal, s))
_GRACE = 15.0  # seconds the server gets to stop on SIGTERM before it is killed


def panel_url(base_url: str, experiment_id: str | None = None, rf_experiment: str | None = None
              ) -> str:
    """The control panel (:mod:`.panel_app`), showing the trl-rapidfire experiment
    ``rf_experiment`` of MLflow experiment ``experiment_id`` (by default the one training, else
    the newest)."""
    from .panel_app import PANEL_PATH

    where = "".join(f"/{quote(str(part), safe='')}" for part in (experiment_id, rf_experiment)
                    if part is not None)
    return f"{base_url.rstrip('/')}{PANEL_PATH}" + (f"#{where}" if where else "")


def landing_url(uri: str, base_url: str, done: dict[str, int] | None = None) -> str:
    """Where the dashboard sends a person: :func:`runs_url` of the newest trl-rapidfire
    experiment in the store (its view written first), else ``base_url``."""
    from mlflow import MlflowClient

    from .experiments import list_experiments

    found = list_experiments(uri=uri)  # newest first
    if not found:
        return base_url
    # Every MLflow experiment holding trl-rapidfire runs gets the view, for a person who
    # moves from the newest one to an older one in the UI.
    ensure_all_views(MlflowClient(uri), found, {} if done is None else done)
    return runs_url(base_url, found[0].experiment_id)


_VIEWS_EVERY = 5.0  # seconds between two looks for experiments without the view


def _keep_views(uri: str, stop: threading.Event, done: dict[str, int]) -> None:
    """While the server serves: each experiment trained meanwhile (or whose runs were not all
    registered yet) gets the saved view, so that its runs table opens on it too; ``done``:
    what the views were made from (:func:`~.mlflow_view.ensure_all_views`)."""
    from mlflow import MlflowClient

    from .experiments import list_experiments

    client = MlflowClient(uri)
    while not stop.wait(_VIEWS_EVERY):
        # A store busy with training, or a view MLflow refuses: asked again at the next look.
        with contextlib.suppress(Exception):
            ensure_all_views(client, list_experiments(uri=uri), done)


def local_store_path(uri: str) -> Path | None:
    """The file or folder a local store URI names (sqlite file, ``file:`` or plain path to an
    ``mlruns`` folder); ``None`` for a database server or a tracking server."""
    if uri.startswith("sqlite:///"):
        return Path(unquote(uri[len("sqlite:///"):].split("?")[0]))
    if uri.startswith("file:"):
        return Path(unquote(urlparse(uri).path))
    if "://" not in uri and not uri.startswith(("sqlite:", "databricks")):
        return Path(uri)
    return None


def _is_server(uri: str) -> bool:
    """A tracking server (HTTP, Databricks), as opposed to a store ``mlflow server`` opens."""
    return uri.startswith("databricks") or ("://" in uri and not uri.startswith(
        ("sqlite:", "postgresql", "mysql", "mssql", "file:")))


# ---------------------------------------------------------------- the server's processes


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every live process, from /proc (empty elsewhere:
    the process group alone is then signalled). Zombies are dead: they hold no port."""
    table: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # it ended meanwhile
                continue
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def _server_processes(leader: int) -> set[int]:
    """The server's process group and every descendant of its first process, also those that
    left the group (a worker may start a session of its own)."""
    table = _process_table()
    found = {pid for pid, (_, group) in table.items() if group == leader}
    found |= {leader} & table.keys()
    while True:
        more = {pid for pid, (parent, _) in table.items() if parent in found} - found
        if not more:
            return found
        found |= more


def _signal_all(leader: int, pids: set[int], signum: int) -> None:
    """``signum`` to the server's process group, and to each of ``pids`` that left it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)
    table = _process_table()
    for pid in pids:
        if pid in table and table[pid][1] != leader:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


def stop_server(proc: subprocess.Popen, grace: float = _GRACE) -> None:
    """Stop the server ``proc`` leads and everything it started: SIGTERM (uvicorn closes its
    connections), then SIGKILL for what is still there after ``grace`` seconds. Called also
    when the server ended on its own, as its workers may have outlived it."""
    # Listed before any signal: once a process ends, its children are re-parented and could
    # no longer be found from the server.
    pids = _server_processes(proc.pid)
    _signal_all(proc.pid, pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.poll() is None or pids & _process_table().keys():
        if time.monotonic() > deadline:
            _signal_all(proc.pid, pids | _server_processes(proc.pid), signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            return
        time.sleep(0.1)


def _die_with_parent() -> Callable[[], None] | None:
    """Linux only: the server gets SIGTERM when the dashboard dies, even by SIGKILL, when no
    handler of ours can run. Resolved here, in the parent, so that the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM))


class _Stop(BaseException):
    """A stop signal arrived (a BaseException, as KeyboardInterrupt: no ``except Exception``
    on the way swallows it)."""


@contextlib.contextmanager
def _stop_signals() -> Iterator[dict[str, bool]]:
    """SIGINT, SIGTERM and SIGHUP raise :class:`_Stop` in the main thread, once: a second
    signal while the server is being stopped must not cut the cleanup short."""
    state = {"stopping": False}

    def handler(signum: int, _frame: Any) -> None:
        if not state["stopping"]:
            state["stopping"] = True
            raise _Stop(signum)

    if threading.current_thread() is not threading.main_thread():
        yield state  # signal handlers can only be set from the main thread
        return
    previous = {s: signal.signal(s, handler) for s in _STOP_SIGNALS}
    try:
        yield state
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


# ---------------------------------------------------------------- serving


def _say(text: str) -> None:
    # After SIGHUP the terminal may be gone: a line that cannot be written is not an error.
    with contextlib.suppress(OSError):
        print(text, flush=True)


# What `mlflow server` says at every start that tells a person nothing here (the store is the
# one the dashboard named; it listens on 127.0.0.1 only): dropped from its output, every other
# line passed on as it comes (its errors, a traceback).
_NOISE = ("Registry store URI not provided. Using backend store URI.",
          "[MLflow] Security middleware enabled with default settings (localhost-only).")
# MLflow 3.x imports starlette's WSGI middleware, which starlette warns is deprecated: the
# warning is for MLflow's authors. Filtered by its own text (and only it) in the child.
_WARNINGS = "ignore:starlette.middleware.wsgi is deprecated:UserWarning"


def _child_env(verbose: bool) -> dict[str, str]:
    # The job runner (GenAI jobs) would be one more process tree, for nothing here.
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    if not verbose:
        env["PYTHONWARNINGS"] = ",".join(w for w in (env.get("PYTHONWARNINGS"), _WARNINGS) if w)
    return env


def _pass_on(source: Any, sink: Any, quiet: bool) -> None:
    """Copy the server's output ``source`` to ``sink`` line by line, less its known noise
    (``quiet``); ends with the server's output."""
    with contextlib.suppress(OSError, ValueError):  # a terminal gone (SIGHUP): nothing to show
        for line in source:
            if quiet and line.startswith(_NOISE):
                continue
            sink.write(line)
            sink.flush()


def _answers(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
            return r.status == 200
    except (OSError, http.client.HTTPException):
        return False


def _check_port(port: int) -> None:
    """Fail with one line, before anything starts, when another process listens on ``port``
    (uvicorn would die with a traceback in the middle of the server's output)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError as err:
            raise OSError(f"port {port} on 127.0.0.1 is taken ({err.strerror}): another "
                          "dashboard may be running there; choose a port with --port") from None


def serve(uri: str, port: int = 5000, *, create: bool = False, verbose: bool = False) -> int:
    """Serve the MLflow UI for the store ``uri`` on ``127.0.0.1:port`` until a stop signal
    (the server's access log only with ``verbose``).

    Before the server starts, each MLflow experiment of the store holding trl-rapidfire runs
    gets the saved view :func:`runs_url` opens (one experiment tag, :func:`ensure_runs_view`).

    Returns the exit code: 0 when stopped by SIGINT, SIGTERM or SIGHUP, the server's own code
    when it ended by itself.

    Raises:
        LookupError: a local store that does not exist, and ``create`` is false (nothing is
            created: a dashboard started in the wrong folder says so instead of showing an
            empty store).
        ChildProcessError: the server ended before it answered.
        OSError: ``port`` is taken.
    """
    if _is_server(uri):
        _say(f"The store {uri} is a tracking server already: open it in a browser.")
        return 0
    path = local_store_path(uri)
    if path is not None and not path.exists() and not create:
        raise LookupError(
            f"no MLflow store at {path.absolute()} (nothing was tracked from here): start the "
            "dashboard where the experiment ran, point it at a store with --uri (e.g. "
            "sqlite:////path/to/mlflow.db) or MLFLOW_TRACKING_URI, or pass --create to start "
            "an empty one")
    _check_port(port)
    base_url = f"http://127.0.0.1:{port}"
    viewed: dict[str, int] = {}  # what each experiment's saved view was made from
    views_stop = threading.Event()
    with _stop_signals() as state:
        proc = None
        try:
            _say(f"Starting the MLflow UI for {uri} on {base_url} ...")
            # Before the server starts, so the two never create a new store's tables at once.
            from ..tracking.mlflow_store import ensure_schema

            ensure_schema(uri)
            try:
                url = landing_url(uri, base_url, viewed)
            except Exception as err:  # noqa: BLE001 - the view is a convenience, the UI is not
                _say(f"(the runs view could not be written: {' '.join(str(err).split())[:300]})")
                url = base_url
            proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                 # The control panel, served by the same server (MLflow's app plugin).
                 "--app-name", "trl-rapidfire",
                 # One access-log line per request (the UI polls) drowns what matters, and
                 # uvicorn's "started" lines come before the links: its warnings and errors
                 # only.
                 *([] if verbose else ["--uvicorn-opts",
                                       "--no-access-log --log-level warning"])],
                env=_child_env(verbose), start_new_session=True,
                preexec_fn=_die_with_parent(), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, errors="replace")
            passing = [threading.Thread(target=_pass_on, args=(source, sink, not verbose),
                                        name="rapidfire-dashboard-output", daemon=True)
                       for source, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
            for thread in passing:
                thread.start()
            while not _answers(base_url):
                if proc.poll() is not None:
                    for thread in passing:  # its last words first, then ours
                        thread.join(timeout=5)
                    raise ChildProcessError(
                        f"mlflow server ended (exit code {proc.returncode}) before it answered "
                        f"on {base_url}; its output is above")
                time.sleep(0.5)
            note = "" if url != base_url else "no trl-rapidfire experiment in the store yet; "
            _say(f"MLflow UI: {url}  ({note}Ctrl-C to stop)")
            _say(f"Control panel: {panel_url(base_url)}")
            threading.Thread(target=_keep_views, args=(uri, views_stop, viewed),
                             name="rapidfire-dashboard-views", daemon=True).start()
            return proc.wait() or 0
        except _Stop:
            return 0
        finally:
            views_stop.set()
            state["stopping"] = True
            if proc is not None:
                stop_server(proc)
