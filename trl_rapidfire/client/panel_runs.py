"""The control panel's one read of the store: an experiment's runs as its table and curves need
them, and, from the second refresh on, only what moved since the refresh before.

MLflow's ``runs/search`` answers every run with its whole config (a trainer's ~150 params) and
has no field selection, so a panel refresh through it costs O(runs x params): 2.1 s at 500
runs. ``POST /rapidfire/api/runs`` ``{"experiment": <MLflow id>, "rfid": <trl-rapidfire
id>, "held": ...}`` (or ``GET`` with those in its query string; :func:`runs_answer`) reads the
store the server serves (``mlflow.server.handlers``'s own tracking store) and answers:

- ``runs``: per run its name, MLflow status, the ``rapidfire.*`` tags the table shows (the
  experiment's ranking metric among them, ``rapidfire.ranking``: :mod:`..reports.ranking`), its
  latest ``loss`` and ``eval_loss`` ([value, step]), the trainer kind's own metric and the
  ranking metric where logged, and, the first time the page sees it,
  ``params``: its knobs only (named by its ``rapidfire.knobs`` tag; a run tracked before that
  tag gives all its params), a knob holding a config object expanded to dotted fields;
- ``points``: the ``loss`` points logged since the page's last refresh (at most
  ``MAX_POINTS`` an answer: the rest come with the next ones);
- ``gone``: the id prefixes of runs the page holds that are no longer there; ``full``:
  whether the page held nothing (a first refresh);
- ``state`` (when it is not ``training``): the experiment's state as the CLI says it
  (:func:`.experiments.experiment_state`: a training process on the server's machine that
  is gone reads ``not responding`` at once, whatever MLflow's RUNNING and its heartbeat
  say), and per row ``shown``: the run's status
  as the views show it (``interrupted`` for a run in the rotation of an experiment that is not
  training).

Which runs moved is said by the page itself, so that any server process can answer (``mlflow
server`` runs 4 by default) and none keeps anything between two refreshes: each row carries
``v``, a short digest of it, and the page sends back ``held``, per run it holds the first 10
hex digits of its id, its ``v`` and the step of its last loss point (about 19 bytes a run, in
a ``POST`` body). A run whose ``v`` is the same is not sent again, its points after that step
are. Whatever ``held`` says, an answer is what the store holds: a wrong ``held`` only gets a
page more or fewer rows.

A SQL store (sqlite, PostgreSQL, MySQL: MLflow's ``SqlAlchemyStore``) is read through its own
tables, selecting only these columns; any other store through its ``search_runs`` and metric
histories (correct, not lean). The route only reads.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..reports.kind_metrics import KIND_METRICS
from ..reports.ranking import RANKING_TAG, recorded_ranking
from ..runtime.foreign_mlflow import latest_metrics
from ..shared_state.runs import shown_status
from ..tracking.tags import HEARTBEAT_TAG, PROCESS_TAG
from .experiments import experiment_state

__all__ = ["LEAN_TAGS", "MAX_HELD", "MAX_POINTS", "RunsQuery", "expanded", "knob_names",
           "parse_held", "parse_query", "reader_for", "runs_answer"]

# The tags a row shows; everything else of a run stays in the store.
LEAN_TAGS = ("rapidfire.run", "rapidfire.status", "rapidfire.progress", "rapidfire.op",
             "rapidfire.op.result", "rapidfire.op.seq", "rapidfire.knobs", "rapidfire.parent",
             "rapidfire.warm_start", RANKING_TAG)
# What the experiment's state is read from (experiments.experiment_state).
_PARENT_TAGS = (HEARTBEAT_TAG, PROCESS_TAG)
_SHOWN = ("loss", "eval_loss")  # every row has these (None: not logged yet)
# A trainer kind's own metric (a reward model's accuracy, a policy's reward): in a row when
# logged, its column shown beside the losses (reports/kind_metrics.py).
_KIND = tuple(f"{prefix}{key}" for _, key in KIND_METRICS for prefix in ("", "eval_"))
_METRICS = (*_SHOWN, *_KIND)
_CURVE = "loss"
MAX_POINTS = 60_000  # loss points in one answer (about 1 MB of JSON)
_PARAM_TEXT = 2_000  # a param value, as the page gets it
MAX_HELD = 256 * 1024  # the page's `held` text: ~13,000 runs (a larger page starts over)
_PREFIX = 10  # hex digits of a run id that name it in `held`
_BATCH = 500  # ids in one IN (...) list, under sqlite's variable limit
_EXPERIMENT_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")
_RFID = re.compile(r"^[0-9a-f]{8,64}$")
_HELD = re.compile(r"^[0-9a-f]{16}[0-9a-f]{0,12}$")
_SQL_INT_MAX = 2**63 - 1  # an SQL store's experiment ids are 64-bit integers
_METRIC = re.compile(r"^[A-Za-z0-9_./-]{1,120}$")  # MLflow's metric names, bounded


class RunsQuery:
    """A checked query: the MLflow experiment id, the trl-rapidfire experiment id, and what
    the page holds (``None``: a first refresh): by run id prefix, its row's ``v`` and the step
    of its last loss point (``-1``: none). The "why" view's also the metric the page ranks by
    and its ``mode`` (``None``: the experiment's ranking metric)."""

    def __init__(self, experiment: str, rfid: str,
                 held: dict[str, tuple[str, int]] | None, metric: str | None = None,
                 mode: str | None = None) -> None:
        self.experiment, self.rfid, self.held = experiment, rfid, held
        self.metric, self.mode = metric, mode


def parse_held(text: str) -> dict[str, tuple[str, int]]:
    """The page's ``held`` text: ``<id prefix><v><step in hex>`` per run, comma-separated
    (``ValueError`` for anything else). A prefix twice is held by no one (both re-sent)."""
    if len(text) > MAX_HELD:
        raise ValueError(f"'held' must be at most {MAX_HELD} characters")
    held: dict[str, tuple[str, int]] = {}
    twice = set()
    for entry in text.split(",") if text else []:
        if not _HELD.match(entry):
            raise ValueError("'held' must list <id prefix><v><step> entries")
        prefix, digest, step = entry[:_PREFIX], entry[_PREFIX:_PREFIX + 6], entry[_PREFIX + 6:]
        if prefix in held:
            twice.add(prefix)
        held[prefix] = (digest, int(step, 16) if step else -1)
    for prefix in twice:
        del held[prefix]
    return held


def parse_query(args: Mapping[str, Any]) -> RunsQuery:
    """The route's query (its query string, or its JSON body), checked; ``ValueError`` for
    anything else."""
    unknown = set(args) - {"experiment", "rfid", "held", "metric", "mode"}
    if unknown:
        raise ValueError(f"unknown parameter {sorted(unknown)[0][:40]!r}")
    experiment, rfid, held = args.get("experiment"), args.get("rfid"), args.get("held")
    metric, mode = args.get("metric"), args.get("mode")
    if metric is not None and (not isinstance(metric, str) or not _METRIC.match(metric)):
        raise ValueError("'metric' must be a logged metric's name")
    if mode not in (None, "min", "max"):
        raise ValueError("'mode' must be 'min' or 'max'")
    if (not isinstance(experiment, str) or not _EXPERIMENT_ID.match(experiment)
            or (experiment.isdigit() and int(experiment) > _SQL_INT_MAX)):
        # A number past the store's integers is no experiment of it (not a server error).
        raise ValueError("'experiment' must be an MLflow experiment id")
    if not isinstance(rfid, str) or not _RFID.match(rfid):
        raise ValueError("'rfid' must be a trl-rapidfire experiment id (8-64 hex digits)")
    if held is not None and not isinstance(held, str):
        raise ValueError("'held' must be text")
    return RunsQuery(experiment, rfid, None if held is None else parse_held(held), metric, mode)


def _digest(row: Mapping[str, Any]) -> str:
    """A row's version: what the page compares to know whether it moved."""
    text = json.dumps(row, sort_keys=True).encode()
    return hashlib.blake2b(text, digest_size=3).hexdigest()


def knob_names(tags: Mapping[str, str]) -> list[str] | None:
    """The knob names a run's ``rapidfire.knobs`` tag lists (``None``: no such tag, or one
    that does not read as a list of names). The tag is text from outside: bounded in size and
    depth before it is parsed (5000 ``[`` would be a RecursionError to ``json``), as
    :func:`.experiments.tracked_knobs` reads it."""
    from ..storage.outside_text import loads
    from ..tracking.tags import KNOBS_TAG

    try:
        names = loads(tags.get(KNOBS_TAG) or "null", what=f"the {KNOBS_TAG} tag",
                      max_bytes=8000)
    except ValueError:  # too long, too deep or no JSON (OutsideTextError is a ValueError)
        return None
    ok = isinstance(names, list) and all(isinstance(n, str) for n in names)
    return names[:200] if ok else None


def expanded(params: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Each run's knobs with a config-object knob (``peft_config``'s ``LoraConfig(r=8, ...)``)
    as its dotted fields (``peft_config.r``), every field, each run on its own: an answer
    holds the new runs only, so which fields differ is the page's to find, over all it holds
    (:func:`..reports.knob_fields.config_fields` reads the text, never evaluates it)."""
    from ..reports.knob_fields import config_fields

    out: dict[str, dict[str, str]] = {}
    for run_id, knobs in params.items():
        row: dict[str, str] = {}
        for key, value in knobs.items():
            fields = config_fields(value) if "." not in key else None
            if fields is None:
                row[key] = value
                continue
            for name, field in fields.items():
                row[f"{key}.{name}"] = field if isinstance(field, str) else json.dumps(
                    field, default=str)
        out[run_id] = row
    return out


def reader_for(store: Any) -> Any:
    """What reads ``store``: its SQL tables (a ``SqlAlchemyStore``), else its own API."""
    return _SqlReader(store) if hasattr(store, "engine") else _StoreReader(store)


def runs_answer(store: Any, query: RunsQuery) -> dict[str, Any]:
    """The route's answer to ``query`` from the MLflow tracking ``store``."""
    reader = reader_for(store)
    held = query.held or {}
    rows = reader.rows(query.experiment, query.rfid)
    status, tags = reader.parent(query.experiment, query.rfid)
    state = experiment_state(status, tags)[0] if status is not None else None
    for row in rows:  # part of the row's digest: a row is sent again when its shown status moves
        row["shown"] = shown_status(row["tags"].get("rapidfire.status"),
                                    training=state in (None, "training"))
    prefixes = [r["id"][:_PREFIX] for r in rows]
    shared = {p for p, n in Counter(prefixes).items() if n > 1}  # held by no one: re-sent
    changed, steps, new = [], {}, {}
    for row, prefix in zip(rows, prefixes):
        version = _digest(row)
        mine = held.get(prefix) if prefix not in shared and len(prefix) == _PREFIX else None
        steps[row["id"]] = mine[1] if mine else -1
        if mine is None:  # a run the page has not seen comes with its knobs
            new[row["id"]] = knob_names(row["tags"])
        if mine is None or mine[0] != version:
            changed.append(dict(row, v=version))
    if new:
        params = expanded(reader.params(new))
        for row in changed:
            if row["id"] in params:
                row["params"] = {k: v[:_PARAM_TEXT] for k, v in params[row["id"]].items()}
    moved = {r["id"]: steps[r["id"]] for r in rows
             if r["loss"] is not None and r["loss"][1] > steps[r["id"]]}
    now = set(prefixes)
    answer = {"full": query.held is None, "runs": changed,
              "gone": sorted(p for p in held if p not in now),
              "points": reader.points(moved, MAX_POINTS)}
    if state not in (None, "training"):  # the page's own reading (its heartbeat) is outdone
        answer["state"] = state
    return answer


def _row(run_id: str, name: str, status: str, tags: dict[str, str],
         metrics: dict[str, list[Any]]) -> dict[str, Any]:
    return {"id": run_id, "name": tags.get("rapidfire.run") or name or run_id,
            "mlflow_status": status, "tags": tags,
            **{m: metrics.get(m) for m in _SHOWN},
            **{m: metrics[m] for m in metrics if m not in _SHOWN}}


def _metric_keys(tags: Iterable[Mapping[str, str]]) -> list[str]:
    """The metrics a row holds: the losses, a trainer kind's own, and the experiment's
    ranking metric as its runs' tags record it (any logged key: ``eval_bleu``)."""
    ranking = recorded_ranking(tags)
    return list(dict.fromkeys((*_METRICS, *(ranking.keys if ranking else ()))))


def _batches(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _BATCH):
        yield items[i:i + _BATCH]


class _SqlReader:
    """MLflow's SQL tables, only the columns the panel shows."""

    def __init__(self, store: Any) -> None:
        self.engine = store.engine

    def _all(self, sql: str, expanding: Sequence[str] = (), **binds: Any) -> list[Any]:
        from sqlalchemy import bindparam, text

        statement = text(sql)
        if expanding:
            statement = statement.bindparams(*(bindparam(n, expanding=True) for n in expanding))
        with self.engine.connect() as conn:
            return list(conn.execute(statement, binds))

    def rows(self, experiment: str, rfid: str) -> list[dict[str, Any]]:
        """The experiment's active runs of ``rfid``, as the page's rows."""
        ours = ("SELECT r.run_uuid FROM runs r JOIN tags e ON e.run_uuid = r.run_uuid"
                " JOIN tags o ON o.run_uuid = r.run_uuid WHERE r.experiment_id = :eid"
                " AND r.lifecycle_stage = 'active' AND e.key = 'rapidfire.experiment'"
                " AND e.value = :rfid AND o.key = 'rapidfire.role' AND o.value = 'run'")
        binds = {"eid": _sql_id(experiment), "rfid": rfid}
        runs = self._all(f"SELECT run_uuid, name, status FROM runs WHERE run_uuid IN ({ours})",
                         **binds)
        tags: dict[str, dict[str, str]] = {r[0]: {} for r in runs}
        for run_id, key, value in self._all(
                "SELECT run_uuid, key, value FROM tags WHERE key IN :keys"
                f" AND run_uuid IN ({ours})",
                ("keys",), keys=list(LEAN_TAGS), **binds):
            tags.setdefault(run_id, {})[key] = value
        metrics: dict[str, dict[str, list[Any]]] = {}
        for run_id, key, value, step, is_nan in self._all(
                "SELECT run_uuid, key, value, step, is_nan FROM latest_metrics WHERE key IN :keys"
                f" AND run_uuid IN ({ours})", ("keys",), keys=_metric_keys(tags.values()),
                **binds):
            metrics.setdefault(run_id, {})[key] = [None if is_nan else value, step]
        return [_row(r[0], r[1], r[2], tags[r[0]], metrics.get(r[0], {})) for r in runs]

    def parent(self, experiment: str, rfid: str) -> tuple[str | None, dict[str, str]]:
        """The MLflow status and the heartbeat and process tags of the experiment's parent run
        (``None``: no parent run)."""
        found = self._all(
            "SELECT r.run_uuid, r.status FROM runs r JOIN tags e ON e.run_uuid = r.run_uuid"
            " JOIN tags o ON o.run_uuid = r.run_uuid WHERE r.experiment_id = :eid"
            " AND r.lifecycle_stage = 'active' AND e.key = 'rapidfire.experiment'"
            " AND e.value = :rfid AND o.key = 'rapidfire.role' AND o.value = 'experiment'"
            " ORDER BY r.start_time DESC", eid=_sql_id(experiment), rfid=rfid)
        if not found:
            return None, {}
        run_id, status = found[0]
        tags = {k: v for k, v in self._all(
            "SELECT key, value FROM tags WHERE run_uuid = :run AND key IN :keys", ("keys",),
            run=run_id, keys=list(_PARENT_TAGS))}
        return status, tags

    def params(self, names: Mapping[str, list[str] | None]) -> dict[str, dict[str, str]]:
        """The knobs ``names`` of each run (``None``: all its params)."""
        found: dict[str, dict[str, str]] = {i: {} for i in names}
        wanted = sorted({n for ns in names.values() if ns for n in ns})
        some = [i for i, ns in names.items() if ns is not None]
        every = [i for i, ns in names.items() if ns is None]
        for ids in _batches(some):
            if wanted:
                for run_id, key, value in self._all(
                        "SELECT run_uuid, key, value FROM params WHERE run_uuid IN :ids"
                        " AND key IN :keys", ("ids", "keys"), ids=list(ids), keys=wanted):
                    if key in (names[run_id] or ()):
                        found[run_id][key] = value
        for ids in _batches(every):
            for run_id, key, value in self._all(
                    "SELECT run_uuid, key, value FROM params WHERE run_uuid IN :ids", ("ids",),
                    ids=list(ids)):
                found[run_id][key] = value
        return found

    def points(self, after: Mapping[str, int], limit: int) -> dict[str, list[list[Any]]]:
        """Each run's ``loss`` points after its step in ``after``, ``limit`` in all."""
        found: dict[str, list[list[Any]]] = {}
        left = limit
        for ids in _batches(sorted(after)):
            rows = self._all(
                "SELECT run_uuid, step, value, is_nan FROM metrics WHERE run_uuid IN :ids"
                " AND key = :key AND step > :low ORDER BY run_uuid, step, timestamp", ("ids",),
                ids=list(ids), key=_CURVE, low=min(after[i] for i in ids))
            for run_id, step, value, is_nan in rows:
                if step > after[run_id] and left > 0:
                    found.setdefault(run_id, []).append([step, None if is_nan else _short(value)])
                    left -= 1
        return found


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value  # NaN is not JSON


def _short(value: float) -> float | None:
    """A curve's point to 6 significant digits (a plot shows 3 or 4): half the bytes."""
    return None if math.isnan(value) else float(f"{value:.6g}")


def _sql_id(experiment: str) -> Any:
    return int(experiment) if experiment.isdigit() else experiment


class _StoreReader:
    """Any other MLflow store, through its own API (every param comes along: not lean)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._runs: dict[str, Any] = {}

    def rows(self, experiment: str, rfid: str) -> list[dict[str, Any]]:
        """As :meth:`_SqlReader.rows`."""
        from mlflow.entities import ViewType

        found, token = [], None
        while True:
            page = self.store.search_runs(
                [experiment], f"tags.`rapidfire.role` = 'run' and tags.`rapidfire.experiment`"
                f" = '{rfid}'", ViewType.ACTIVE_ONLY, 1000, None, token)
            found += list(page)
            token = page.token
            if not token:
                break
        self._runs = {r.info.run_id: r for r in found}
        keys = set(_metric_keys(r.data.tags for r in found))
        return [_row(r.info.run_id, r.info.run_name, r.info.status,
                     {k: v for k, v in r.data.tags.items() if k in LEAN_TAGS},
                     {m.key: [_number(m.value), m.step] for m in self._latest(r, keys)})
                for r in found]

    @staticmethod
    def _latest(run: Any, keys: set[str]) -> list[Any]:
        # The latest values with their steps: MLflow keeps them in a private name (the wall).
        return [m for m in latest_metrics(run) if m.key in keys]

    def parent(self, experiment: str, rfid: str) -> tuple[str | None, dict[str, str]]:
        """As :meth:`_SqlReader.parent`."""
        from mlflow.entities import ViewType

        page = self.store.search_runs(
            [experiment], f"tags.`rapidfire.role` = 'experiment' and tags.`rapidfire.experiment`"
            f" = '{rfid}'", ViewType.ACTIVE_ONLY, 1, ["attributes.start_time DESC"], None)
        if not page:
            return None, {}
        run = page[0]
        return run.info.status, {k: v for k, v in run.data.tags.items() if k in _PARENT_TAGS}

    def params(self, names: Mapping[str, list[str] | None]) -> dict[str, dict[str, str]]:
        """As :meth:`_SqlReader.params`."""
        return {i: {k: v for k, v in self._runs[i].data.params.items()
                    if ns is None or k in ns} for i, ns in names.items() if i in self._runs}

    def points(self, after: Mapping[str, int], limit: int) -> dict[str, list[list[Any]]]:
        """As :meth:`_SqlReader.points`."""
        found: dict[str, list[list[Any]]] = {}
        for run_id, low in sorted(after.items()):
            history = sorted(self.store.get_metric_history(run_id, _CURVE),
                             key=lambda m: (m.step, m.timestamp))
            got = [[m.step, _short(m.value)] for m in history if m.step > low][:max(limit, 0)]
            limit -= len(got)
            if got:
                found[run_id] = got
        return found
