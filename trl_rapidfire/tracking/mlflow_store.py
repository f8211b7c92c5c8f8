"""The MLflow store itself: its schema made once, and a half-created one repaired or explained.

A process killed while MLflow creates a new sqlite store's tables leaves a file every later
start dies on (``table registered_models already exists``). Such a file that holds nothing is
moved aside and made anew, with a warning; one that holds runs is left alone, with one error
naming it and what to do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TrackingStoreError", "ensure_schema", "quiet_setup"]


class TrackingStoreError(RuntimeError):
    """The MLflow store cannot be used; the message names the file and what to do."""


# A store a killed process left half-created: MLflow's DDL commits statement by statement while
# the alembic revision lags, so the next start re-runs a migration whose table is there.
_HALF_CREATED = ("already exists", "duplicate column name")
# Tables of what a person made, and which rows count (MLflow's own Default experiment aside).
_DATA_TABLES = {"runs": "", "experiments": " WHERE experiment_id != 0", "registered_models": "",
                "trace_info": "", "logged_models": ""}


@contextlib.contextmanager
def quiet_setup(*, import_mlflow: bool = True) -> Iterator[None]:
    """MLflow's and alembic's INFO lines (``Creating initial MLflow database tables...``,
    ``Updating database tables``, alembic's migration steps) held back for the duration: they
    describe MLflow's housekeeping, not the experiment. Warnings and errors still show; the
    loggers' levels are as they were afterwards.

    MLflow sets its logger's level when it is imported, so it is imported first; a caller
    that sets ``MLFLOW_LOGGING_LEVEL`` instead (the CLI, which must not pay seconds of import
    for a command that may not need MLflow) passes ``import_mlflow=False``."""
    if import_mlflow:
        import mlflow  # noqa: F401

    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def ensure_schema(uri: str) -> None:
    """Make sure the store at ``uri`` has MLflow's schema: created once, under a lock, or
    repaired when a killed process left it half-created and it holds nothing."""
    with quiet_setup():
        _ensure_schema(uri)


def _ensure_schema(uri: str) -> None:
    # Several processes creating a new sqlite store at once crash MLflow ("table already
    # exists"): create the schema once, under a lock beside the database file.
    from filelock import FileLock
    from mlflow import MlflowClient

    db = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
    if db is None:
        MlflowClient(uri).search_experiments(max_results=1)
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(db) + ".lock"):
        try:
            MlflowClient(uri).search_experiments(max_results=1)
            return
        except Exception as err:  # noqa: BLE001 - only a half-created store is handled here
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            if not db.is_file() or not any(w in first.lower() for w in _HALF_CREATED):
                raise
        _move_aside(db, first)
        MlflowClient(uri).search_experiments(max_results=1)


def _move_aside(db: Path, error: str) -> None:
    """Move a half-created store that holds nothing aside (MLflow then creates a new one); one
    holding data is not ours to move: say what to do."""
    import sqlite3
    from contextlib import closing

    try:
        with closing(sqlite3.connect(str(db))) as con:
            have = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
            counts = {t: con.execute(f"SELECT COUNT(*) FROM {t}{rows}").fetchone()[0]
                      for t, rows in _DATA_TABLES.items() if t in have}
        held = ", ".join(f"{n} {t}" for t, n in counts.items() if n)
    except sqlite3.Error as err:  # unreadable: never moved
        held = f"unreadable: {err}"
    if held:
        raise TrackingStoreError(
            f"the MLflow store {db} has a half-created schema (a process was killed while MLflow "
            f"created or upgraded its tables: {error}) and holds data ({held}), so it is left as "
            "it is: restore it from a backup, or move it aside to start a new store")
    # MLflow's cached engine per URI (internals) has connections open on the file to move.
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for engine in list(getattr(SqlAlchemyStore, "_engine_map", {}).values()):
        if Path(str(engine.url.database or "")).resolve() == db.resolve():
            engine.dispose()
    broken = db.with_name(f"{db.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    # A hot journal belongs to its file: left here, sqlite would replay it into the new one.
    for side in ("-journal", "-wal", "-shm", ""):
        if db.with_name(db.name + side).exists():
            os.replace(db.with_name(db.name + side), broken.with_name(broken.name + side))
    warnings.warn(f"trl-rapidfire: the MLflow store {db} was half-created (a process was killed "
                  f"while MLflow created its tables: {error}); it held no runs, so it was moved "
                  f"to {broken} and a new store is created in its place",
                  RuntimeWarning, stacklevel=4)
