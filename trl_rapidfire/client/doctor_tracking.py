"""The doctor's tracking check: whether the store the runs will be tracked in
(``MLFLOW_TRACKING_URI``, else ``./mlflow.db``) is one MLflow can use and a training process can
share, and whether its server answers, within :data:`HTTP_TIMEOUT` in all
(:func:`~trl_rapidfire.client.deadlines.fetch_within`: a server that trickles its answer a byte
at a time gets no longer than one that is down). Whatever the URI holds (a NUL byte, ``%00``,
a store only one process sees) is a finding naming the variable, never a traceback."""

from __future__ import annotations

import http.client
import importlib.metadata as md
import os
import re
import stat
import urllib.error
import urllib.parse
from pathlib import Path

from .deadlines import fetch_within
from .doctor_text import Finding, _flag, _kind, _read_head

__all__ = ["HTTP_TIMEOUT", "check_tracking", "redact"]

HTTP_TIMEOUT = 3.0  # seconds for /health in all: connect, send, and read the whole answer
# An sqlite database that lives in one process's memory (SQLAlchemy's `sqlite://` with no
# path, `:memory:`, or sqlite's own `file::memory:` / `mode=memory` URIs): the training process
# and this CLI would each see an empty store of their own.
_MEMORY_DB = re.compile(
    r"^sqlite(\+\w+)?://(/?(:memory:)?|/file::memory:.*|/.*[?&]mode=memory.*)$", re.I)
MAX_URI_CHARS = 4096  # browsers and servers refuse longer URLs; MLflow's stores are far shorter
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every sqlite database
# The schemes MLflow 3 opens a tracking store for (mlflow/tracking/_tracking_service/utils.py,
# _register_tracking_stores), plugins' schemes aside (entry points, looked up when needed).
_MLFLOW_SCHEMES = {"", "file", "http", "https", "databricks", "databricks-uc", "uc"}
_DB_SCHEMES = {"postgresql", "mysql", "sqlite", "mssql"}  # each with an optional +driver


def redact(uri: str) -> str:
    """``uri`` without the credentials it may carry (``user:password@``, query values)."""
    parts = urllib.parse.urlsplit(uri)
    query = "&".join(f"{key}=***" for key, _ in urllib.parse.parse_qsl(parts.query, True))
    return uri if "@" not in parts.netloc and not query else (
        f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}{'?' * bool(query)}{query}")


def _mlflow_scheme(uri: str) -> str | None:
    """The scheme MLflow would open ``uri``'s store by (``""`` for a path), or ``None`` when
    MLflow has no store for it (``javascript:``, ``ftp:``, a typo)."""
    if uri in ("databricks", "databricks-uc", "uc"):  # MLflow's bare profile names
        return uri
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter: a path, as MLflow reads it
        return ""
    base, plus, driver = scheme.partition("+")
    if scheme in _MLFLOW_SCHEMES or (base in _DB_SCHEMES and (not plus or driver.isidentifier())):
        return scheme
    plugins = {e.name for e in md.entry_points(group="mlflow.tracking_store")}
    return scheme if scheme in plugins else None


def _local_store(target: Path, sqlite: bool) -> tuple[str | None, str]:
    """Why MLflow could not keep runs at ``target`` (a sqlite database, else a file store's
    folder), or ``None``; with what to do about it. Never opens a FIFO or reads more than the
    16 bytes that say whether a file is an sqlite database."""
    other = ("set MLFLOW_TRACKING_URI to a new sqlite:///<folder>/mlflow.db (or unset it for "
             "./mlflow.db)")
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path (caught before, too)
        return f"cannot look at {target} ({getattr(err, 'strerror', None) or err})", other
    folder = target.parent
    if mode is None:  # a missing store is created in its folder
        ok = os.access(folder, os.W_OK)
        return (None if ok else f"cannot write {target}"), (f"mkdir -p {folder} (and make it "
                                                             "writable), or set "
                                                             "MLFLOW_TRACKING_URI to another store")
    if stat.S_ISREG(mode):
        try:
            head = _read_head(target, len(SQLITE_HEADER))[:len(SQLITE_HEADER)]
        except (OSError, ValueError) as err:
            return f"cannot read {target} ({getattr(err, 'strerror', None) or err})", other
        is_db = head == SQLITE_HEADER or (sqlite and not head)  # sqlite fills an empty file
        if not sqlite:
            return (f"{target} is {'an sqlite database' if is_db else 'a file'}, not the folder"
                    " a file store is"), (f"MLFLOW_TRACKING_URI=sqlite:///{target}" if is_db
                                          else "point MLFLOW_TRACKING_URI at a folder, or " +
                                          other.removeprefix("set MLFLOW_TRACKING_URI to "))
        if not is_db:
            return f"{target} is a file but not an sqlite database", other
    elif sqlite or not stat.S_ISDIR(mode):
        return f"{target} is {_kind(mode)}, not {'an sqlite database' if sqlite else 'a folder'}", \
            other
    # sqlite writes its journal beside the database: the folder must be writable too.
    ok = os.access(target, os.W_OK) and (not sqlite or os.access(folder, os.W_OK))
    return (None if ok else f"cannot write {target}"), (
        f"make {target} writable, or set MLFLOW_TRACKING_URI to another store")


def check_tracking(uri: str, timeout: float = HTTP_TIMEOUT) -> list[Finding]:
    """Whether the store the runs will be tracked in is one MLflow can use, and answers now,
    not hours in."""
    from .tracked_runs import sqlite_path

    source = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default"
    fix_uri = ("set MLFLOW_TRACKING_URI to http(s)://<host>:<port>, sqlite:///<path>.db or a "
               "folder, or unset it for ./mlflow.db")
    try:  # before anything shows it: an unreadable URI cannot be shown without its secrets
        why = None if len(uri) <= MAX_URI_CHARS else (
            f"{len(uri):,} characters long, over the {MAX_URI_CHARS:,} of any URI MLflow uses")
        found = [Finding("tracking", "store", f"{redact(uri)} ({source})")]
    except ValueError as err:  # urlsplit: "Invalid IPv6 URL", a bad netloc
        why, found = f"not a URI ({err})", [Finding("tracking", "store", f"unreadable ({source})")]
    if why:
        return [*found, Finding("tracking", "reachable", "no", why, fix_uri)]
    if "\x00" in uri or "\x00" in urllib.parse.unquote(uri):
        # No file, host or database can be named with a NUL (os.stat raises ValueError on it).
        return [*found, Finding("tracking", "reachable", "no", f"the URI ({source}) holds a NUL "
                                "byte (raw or as %00), which no store's name can", fix_uri)]
    if _MEMORY_DB.match(uri):
        return [*found, Finding("tracking", "reachable", "no", f"the URI ({source}) is an "
                                "in-memory sqlite database: the training process and "
                                "trl-rapidfire's CLI and dashboard would each see an empty "
                                "store of their own", fix_uri)]
    scheme = _mlflow_scheme(uri)
    if scheme is None:
        return [*found, Finding("tracking", "reachable", "no", f"MLflow keeps no runs at a "
                                f"{urllib.parse.urlsplit(uri).scheme}: URI", fix_uri)]
    parts, db = urllib.parse.urlsplit(uri), sqlite_path(uri)
    if db is not None or scheme in ("", "file"):  # sqlite, or a file store
        target = db or Path(urllib.parse.unquote(parts.path if scheme else uri))
        problem, fix = _local_store(target, sqlite=db is not None)
        value = f"yes, {target} {'exists' if target.exists() else 'is created by the first run'}"
        return [*found, _flag("tracking", "reachable", "no" if problem else value, problem,
                              problem or "", fix)]
    if scheme not in ("http", "https"):
        return [*found, Finding("tracking", "reachable", "not checked here")]
    health = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path.rstrip('/')}/health"
    try:
        said = fetch_within(health, timeout)[:64].decode("utf-8", "replace").strip()
        said = f"yes, /health says {said!r}"
    except urllib.error.HTTPError as err:
        said = f"HTTP {err.code} at /health"
    except (OSError, ValueError, http.client.HTTPException) as err:  # InvalidURL, a bad port
        try:
            port = parts.port or 5000
        except ValueError:
            port = 5000
        return [*found, Finding(
            "tracking", "reachable", "no", f"no answer ({getattr(err, 'reason', None) or err})",
            "start it (mlflow server --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 "
            f"--port {port}), or unset MLFLOW_TRACKING_URI for ./mlflow.db")]
    return [*found, _flag("tracking", "reachable", said, not said.endswith("'OK'"),
                          "not an MLflow server's answer (OK)", "check the URI's host and port")]


