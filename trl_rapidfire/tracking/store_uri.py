"""A tracking URI checked before anything trains, without importing MLflow.

MLflow itself is imported, and its store opened, on the tracking thread (a second or more, and
seconds more to create a new sqlite store's schema: none of it on the way to the first chunk).
What MLflow would refuse at once for any run (a scheme it has no store for, a malformed sqlite
URL, the retired file store, a database driver that is not installed) is refused here, at the
experiment's construction, as it was when MLflow was opened there. Only what MLflow surely
refuses is refused: anything else (a server nobody answers on, credentials) is MLflow's to find,
on the tracking thread, and reported as its errors are.
"""

from __future__ import annotations

import importlib.util
import os
from urllib.parse import urlparse

from ..config.errors import RFConfigError

__all__ = ["check_tracking_uri", "check_mlflow_installed"]

# MLflow 3.17's built-in tracking stores (mlflow/tracking/_tracking_service/utils.py); a plugin
# adds its own schemes through the ``mlflow.tracking_store`` entry point group.
_BUILT_IN = {"", "file", "http", "https", "databricks", "databricks-uc", "uc"}
_DATABASES = ("postgresql", "mysql", "sqlite", "mssql")
# The module SQLAlchemy loads for a database URI (``mysql+pymysql://``: the driver after
# ``+``; none: the dialect's default). A driver not listed is not checked.
_DRIVER_MODULES = {
    "postgresql": "psycopg2", "mysql": "MySQLdb", "mssql": "pyodbc", "psycopg2": "psycopg2",
    "psycopg": "psycopg", "pg8000": "pg8000", "pymysql": "pymysql", "mysqldb": "MySQLdb",
    "mysqlconnector": "mysql.connector", "pyodbc": "pyodbc", "pymssql": "pymssql",
}


def check_mlflow_installed() -> None:
    """``report_to='mlflow'`` without MLflow installed fails now, not on the tracking thread
    (``find_spec`` does not import it)."""
    if importlib.util.find_spec("mlflow") is None:
        raise RFConfigError("report_to='mlflow' needs MLflow: `pip install mlflow` (or drop "
                            "'mlflow' from report_to)")


def _plugin_schemes() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="mlflow.tracking_store")}


def check_tracking_uri(uri: str) -> None:
    """Raise ``RFConfigError`` naming the fix if MLflow would refuse ``uri`` for any run."""
    parsed = urlparse(uri)
    # As MLflow reads it: these bare names are schemes, not paths.
    scheme = uri if uri in ("databricks", "databricks-uc", "uc") else parsed.scheme.lower()
    if len(scheme) == 1 and scheme.isalpha():
        scheme = ""  # a Windows drive (C:\...): a path, as MLflow reads it
    where = f"the MLflow tracking URI {uri!r} (MLFLOW_TRACKING_URI or the default)"
    database = next((db for db in _DATABASES if scheme.startswith(db)), None)
    if database is not None:
        dialect, plus, driver = scheme.partition("+")
        if dialect != database or "+" in driver or (plus and not driver):
            raise RFConfigError(f"{where} is not a database URI MLflow reads: write "
                                f"{database}://... or {database}+<driver>://...")
        if database == "sqlite":
            if parsed.netloc:
                raise RFConfigError(
                    f"{where} names a sqlite host ({parsed.netloc!r}): a sqlite store is a "
                    "file, sqlite:///relative/path.db or sqlite:////absolute/path.db")
            return
        module = _DRIVER_MODULES.get(driver or dialect)
        if module is not None and importlib.util.find_spec(module.split(".")[0]) is None:
            raise RFConfigError(f"{where} needs the database driver {module!r}, which is not "
                                "installed: install it, or use a sqlite store or a server")
        return
    if scheme in ("", "file"):
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() not in ("true", "1"):
            raise RFConfigError(
                f"{where} is a file store, which MLflow 3 refuses (in maintenance mode): use "
                "a sqlite store (sqlite:///mlflow.db, the default when MLFLOW_TRACKING_URI is "
                "unset) or a server, or set MLFLOW_ALLOW_FILE_STORE=true")
        return
    if scheme in ("http", "https") and not parsed.hostname:
        raise RFConfigError(f"{where} names no server: write {scheme}://<host>:<port>")
    if scheme not in _BUILT_IN and scheme not in _plugin_schemes():
        raise RFConfigError(
            f"{where} has the scheme {scheme!r}, which MLflow has no store for: use "
            "sqlite:///<file>.db, http(s)://<server>, a database URI or databricks")
