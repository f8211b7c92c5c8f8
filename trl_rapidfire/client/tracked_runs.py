"""The runs of an MLflow store as commands outside the training process read and tag them.

The CLI's ``status`` and ops need four things of a store: its experiments, the runs that carry
some tags (with their status, tags, latest metrics and params), one experiment by name, and one
tag set. Importing MLflow and opening its store for that costs about 3.5 s on a 2-core machine,
longer than the whole command should take. So the two stores a person most often has are read
through their public shape instead:

- a tracking server (``http(s)://``) through MLflow's REST API (``/api/2.0/mlflow/...``), the
  interface its UI and every client language use;
- a local sqlite store through its tables (``experiments``, ``runs``, ``tags``,
  ``latest_metrics``, ``params``) with the standard library, only when those tables have the
  columns read here; the one write is a row of ``tags``, what ``MlflowClient.set_tag`` writes.

Any other store, a sqlite file whose schema is not there yet (MLflow creates or repairs it:
:func:`.mlflow_store.ensure_schema`), and a server that needs TLS or auth settings beyond a
token or a user name and password go through ``MlflowClient``. The three agree (tested).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import math
import os
import re
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..tracking.mlflow_store import TrackingStoreError
from .deadlines import call_within, fetch_within, shown_url

T = TypeVar("T")

__all__ = ["RunCatalog", "TrackedRun", "open_catalog", "sqlite_path", "sqlite_ready"]

# MLflow's own limit on a tag value (MAX_TAG_VAL_LENGTH); its client refuses longer ones.
_TAG_VALUE_MAX = 8000
# Columns read (or written) here, per table: a store without them is MLflow's to handle.
_COLUMNS = {
    "experiments": {"experiment_id", "name", "lifecycle_stage"},
    "runs": {"run_uuid", "experiment_id", "status", "start_time", "lifecycle_stage"},
    "tags": {"key", "value", "run_uuid"},
    "latest_metrics": {"key", "value", "is_nan", "run_uuid"},
    "params": {"key", "value", "run_uuid"},
}
# Client settings only MLflow's own HTTP client honours: with any of them, it is used.
_CLIENT_ONLY_ENV = ("MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH",
                    "MLFLOW_TRACKING_CLIENT_CERT_PATH", "MLFLOW_TRACKING_AUTH",
                    "MLFLOW_WORKSPACE")
_PAGE = 1000
_SQL_BATCH = 500  # ids per IN (...) list, under sqlite's variable limit


@dataclass(frozen=True)
class TrackedRun:
    """One MLflow run as read from a store.

    Attributes:
        run_id, experiment_id: MLflow's ids (strings, as ``MlflowClient`` gives them).
        status: MLflow's run status (``RUNNING``, ``FINISHED``, ``FAILED``, ``KILLED``, ...).
        start_time: milliseconds since the epoch.
        tags: the run's tags; metrics: the latest value of each metric (MLflow's
            ``run.data.metrics``); params: its params (an RF run's config and knobs: the
            knob columns of ``trl-rapidfire status``).
    """

    run_id: str
    experiment_id: str
    status: str
    start_time: int
    tags: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)


class RunCatalog(Protocol):
    """What a command outside the training process reads from a store, and the one write."""

    uri: str

    def experiment_names(self) -> dict[str, str]:
        """Active experiments: id -> name."""

    def experiment_id(self, name: str) -> str | None:
        """The id of the experiment named ``name`` (``None`` when there is none)."""

    def runs(self, experiment_ids: Sequence[str], tags: Mapping[str, str]) -> list[TrackedRun]:
        """Active runs of those experiments carrying every tag of ``tags`` with that value,
        newest first."""

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        """Set one tag of one run."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (``None`` for any other URI)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(urllib.parse.unquote(uri[len("sqlite:///"):].split("?")[0]))


@functools.cache
def _schema_head() -> str | None:
    """The schema revision the installed MLflow creates, read from its migration scripts
    (``revision`` / ``down_revision`` lines) without importing it; ``None`` if unclear."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0], "store", "db_migrations", "versions")
    revisions, parents = set(), set()
    for script in folder.glob("*.py"):
        for line in script.read_text(encoding="utf-8").splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() == "revision":
                revisions.update(re.findall(r"[0-9a-f]{6,}", value))
            elif sep and name.strip() == "down_revision":
                parents.update(re.findall(r"[0-9a-f]{6,}", value))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def sqlite_ready(path: str | os.PathLike) -> bool:
    """Whether the sqlite file holds the schema the installed MLflow makes, whole: its
    revision is MLflow's newest and every column read here is there. A file half-created by a
    killed process (its revision lags its tables), an older store MLflow would upgrade, or no
    MLflow store at all is not."""
    if not Path(path).is_file():
        return False
    head = _schema_head()
    try:
        with closing(_connect(path)) as con:
            if head is None or not con.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'alembic_version'").fetchone():
                return False
            if con.execute("SELECT version_num FROM alembic_version").fetchall() != [(head,)]:
                return False
            for table, wanted in _COLUMNS.items():
                have = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
                if not wanted <= have:
                    return False
    except sqlite3.Error:  # locked for longer than the timeout, not a database, unreadable
        return False
    return True


def open_catalog(uri: str) -> RunCatalog:
    """The fastest reader that serves ``uri`` exactly (see the module docstring)."""
    path = sqlite_path(uri)
    if path is not None and sqlite_ready(path):
        return SqliteCatalog(uri, path)
    if uri.startswith(("http://", "https://")) and not any(os.environ.get(k)
                                                           for k in _CLIENT_ONLY_ENV):
        return RestCatalog(uri)
    return ClientCatalog(uri)


def _connect(path: str | os.PathLike) -> sqlite3.Connection:
    # The training process writes the same file: wait for its lock as MLflow's engine would.
    return sqlite3.connect(str(path), timeout=30.0)


class SqliteCatalog:
    """A local MLflow sqlite store read through its tables (:func:`sqlite_ready` first)."""

    def __init__(self, uri: str, path: str | os.PathLike) -> None:
        self.uri = uri
        self._path = Path(path)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(_connect(self._path)) as con:
            yield con

    def experiment_names(self) -> dict[str, str]:
        with self._db() as con:
            rows = con.execute("SELECT experiment_id, name FROM experiments "
                               "WHERE lifecycle_stage = 'active'").fetchall()
        return {str(i): name for i, name in rows}

    def experiment_id(self, name: str) -> str | None:
        with self._db() as con:
            row = con.execute("SELECT experiment_id FROM experiments WHERE name = ?",
                              (name,)).fetchone()
        return None if row is None else str(row[0])

    def runs(self, experiment_ids: Sequence[str], tags: Mapping[str, str]) -> list[TrackedRun]:
        if not experiment_ids:
            return []
        where = [f"r.experiment_id IN ({', '.join('?' * len(experiment_ids))})",
                 "r.lifecycle_stage = 'active'"]
        params: list[Any] = [int(i) for i in experiment_ids]
        for key, value in tags.items():
            where.append("EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid "
                         "AND t.key = ? AND t.value = ?)")
            params += [key, value]
        with self._db() as con:
            heads = con.execute(
                "SELECT r.run_uuid, r.experiment_id, r.status, r.start_time FROM runs r "
                f"WHERE {' AND '.join(where)} ORDER BY r.start_time DESC, r.run_uuid",
                params).fetchall()
            ids = [h[0] for h in heads]
            run_tags = self._per_run(con, "SELECT run_uuid, key, value FROM tags", ids)
            run_metrics = self._per_run(
                con, "SELECT run_uuid, key, CASE WHEN is_nan THEN NULL ELSE value END "
                "FROM latest_metrics", ids)
            run_params = self._per_run(con, "SELECT run_uuid, key, value FROM params", ids)
        return [TrackedRun(run_id, str(exp), status or "", int(start or 0),
                           run_tags.get(run_id, {}),
                           {k: math.nan if v is None else float(v)
                            for k, v in run_metrics.get(run_id, {}).items()},
                           run_params.get(run_id, {}))
                for run_id, exp, status, start in heads]

    @staticmethod
    def _per_run(con: sqlite3.Connection, select: str, ids: list[str]
                 ) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for i in range(0, len(ids), _SQL_BATCH):
            batch = ids[i:i + _SQL_BATCH]
            rows = con.execute(f"{select} WHERE run_uuid IN ({', '.join('?' * len(batch))})",
                               batch)
            for run_id, key, value in rows:
                found.setdefault(run_id, {})[key] = value
        return found

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        _check_tag(key, value)
        with self._db() as con, con:  # one transaction: committed, or rolled back
            row = con.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?",
                              (run_id,)).fetchone()
            if row is None or row[0] != "active":
                raise LookupError(f"MLflow run {run_id} is {'deleted' if row else 'missing'} "
                                  f"in {self.uri}")
            con.execute("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?) "
                        "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value",
                        (key, value, run_id))


def _check_tag(key: str, value: str) -> None:
    if not key or len(key) > 250:
        raise ValueError(f"tag key {key[:40]!r} must be 1-250 characters")
    if len(value) > _TAG_VALUE_MAX:
        raise ValueError(f"tag {key} is {len(value)} characters; MLflow stores at most "
                         f"{_TAG_VALUE_MAX}")


def _quoted(value: str) -> str:
    # MLflow's filter grammar has single-quoted literals and no escape this code relies on: a
    # value holding a quote is refused rather than half-matched.
    if "'" in value or "\\" in value:
        raise ValueError(f"a tag value in a search filter cannot hold quotes: {value!r}")
    return f"'{value}'"


def _filter(tags: Mapping[str, str]) -> str:
    return " and ".join(f"tags.`{key}` = {_quoted(value)}" for key, value in tags.items())


class RestCatalog:
    """An MLflow tracking server through its REST API."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._base = uri.rstrip("/") + "/api/2.0/mlflow/"
        self._timeout = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 120)
        self._headers = {"Content-Type": "application/json"}
        token = os.environ.get("MLFLOW_TRACKING_TOKEN")
        user, password = (os.environ.get("MLFLOW_TRACKING_USERNAME"),
                          os.environ.get("MLFLOW_TRACKING_PASSWORD"))
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        elif user and password:
            pair = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {pair}"

    def _call(self, endpoint: str, body: dict | None = None, query: dict | None = None
              ) -> dict:
        url = self._base + endpoint + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers=self._headers,
                                         method="GET" if body is None else "POST")
        try:  # the whole call within the timeout: a trickling server resets a socket's own
            return json.loads(fetch_within(request, self._timeout) or b"{}")
        except urllib.error.HTTPError as err:
            try:
                answer = json.loads(err.read() or b"{}")
            except ValueError:
                answer = {}
            if answer.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
                raise LookupError(answer.get("message", "not found")) from None
            message = answer.get("message") or err.reason
            raise TrackingStoreError(f"the MLflow server at {self.uri} refused {endpoint} "
                                     f"(HTTP {err.code}): {message}") from None

    def _pages(self, endpoint: str, body: dict, key: str) -> Iterator[dict]:
        token = None
        while True:
            answer = self._call(endpoint, {**body, **({"page_token": token} if token else {})})
            yield from answer.get(key, [])
            token = answer.get("next_page_token")
            if not token:
                return

    def experiment_names(self) -> dict[str, str]:
        found = self._pages("experiments/search",
                            {"max_results": _PAGE, "view_type": "ACTIVE_ONLY"}, "experiments")
        return {e["experiment_id"]: e["name"] for e in found}

    def experiment_id(self, name: str) -> str | None:
        try:
            answer = self._call("experiments/get-by-name", query={"experiment_name": name})
        except LookupError:
            return None
        return answer["experiment"]["experiment_id"]

    def runs(self, experiment_ids: Sequence[str], tags: Mapping[str, str]) -> list[TrackedRun]:
        if not experiment_ids:
            return []
        body = {"experiment_ids": list(experiment_ids), "filter": _filter(tags),
                "max_results": _PAGE, "order_by": ["attributes.start_time DESC"],
                "run_view_type": "ACTIVE_ONLY"}
        found = []
        for run in self._pages("runs/search", body, "runs"):
            info, data = run["info"], run.get("data", {})
            found.append(TrackedRun(
                info["run_id"], str(info["experiment_id"]), info.get("status", ""),
                int(info.get("start_time", 0)),
                {t["key"]: t.get("value", "") for t in data.get("tags", [])},
                {m["key"]: float(m["value"]) for m in data.get("metrics", [])},
                {p["key"]: p.get("value", "") for p in data.get("params", [])}))
        return found

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        _check_tag(key, value)
        self._call("runs/set-tag", {"run_id": run_id, "key": key, "value": value})


class ClientCatalog:
    """Any store, through ``MlflowClient`` (seconds to import and open)."""

    def __init__(self, uri: str) -> None:
        from mlflow import MlflowClient

        self.uri = uri
        self._client = MlflowClient(uri)
        # MLflow's requests time out per socket read only: over http(s) each call is given
        # MLFLOW_HTTP_REQUEST_TIMEOUT in all (the CLI sets 5 s), as RestCatalog's are.
        self._deadline = (float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 120)
                          if uri.startswith(("http://", "https://")) else None)

    def _within(self, fn: Callable[[], T]) -> T:
        return fn() if self._deadline is None else call_within(
            self._deadline, fn, f"the MLflow server at {shown_url(self.uri)}")

    def experiment_names(self) -> dict[str, str]:
        return {e.experiment_id: e.name for e in self._within(self._client.search_experiments)}

    def experiment_id(self, name: str) -> str | None:
        found = self._within(lambda: self._client.get_experiment_by_name(name))
        return None if found is None else found.experiment_id

    def runs(self, experiment_ids: Sequence[str], tags: Mapping[str, str]) -> list[TrackedRun]:
        if not experiment_ids:
            return []
        found, token = [], None
        while True:
            page = self._within(functools.partial(
                self._client.search_runs, list(experiment_ids), filter_string=_filter(tags),
                max_results=_PAGE, order_by=["attributes.start_time DESC"], page_token=token))
            found += [TrackedRun(r.info.run_id, r.info.experiment_id, r.info.status,
                                 int(r.info.start_time or 0), dict(r.data.tags),
                                 dict(r.data.metrics), dict(r.data.params)) for r in page]
            token = page.token
            if not token:
                return found

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self._within(lambda: self._client.set_tag(run_id, key, value))
