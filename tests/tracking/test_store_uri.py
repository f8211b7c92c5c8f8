"""A tracking URI MLflow would refuse is refused when the Tracker is made, before anything
trains, although MLflow itself is opened later on the tracking thread: each refusal here is
one MLflow makes too (checked against MLflow itself), and URIs MLflow takes pass."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from sqlalchemy.exc import ArgumentError

from trl_rapidfire.config.errors import RFConfigError
from trl_rapidfire.tracking.store_uri import check_tracking_uri
from trl_rapidfire.tracking.tracker import Tracker

REFUSED = {
    "foo://bar": "has the scheme 'foo'",
    "htp://127.0.0.1:5000": "has the scheme 'htp'",
    "sqlite://relative.db": "names a sqlite host",
    "sqlite+a+b:///x.db": "not a database URI",
    "mysql://user@host/db": "database driver 'MySQLdb'",
    "http:/host": "names no server",
}


@pytest.mark.parametrize("uri", sorted(REFUSED))
def test_a_uri_mlflow_refuses_is_refused_at_construction(uri, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    # MLflow's own refusal, at its client or its first call.
    with pytest.raises((MlflowException, ImportError, ArgumentError)):
        MlflowClient(uri).search_experiments(max_results=1)
    with pytest.raises(RFConfigError, match=REFUSED[uri]) as err:
        Tracker(tmp_path / "exp", uri=uri)
    assert uri in str(err.value)


@pytest.mark.parametrize("path", ["file:///tmp/mlruns", "/tmp/mlruns", "mlruns"])
def test_the_file_store_is_refused_unless_mlflow_is_told_to_allow_it(path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(RFConfigError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        check_tracking_uri(path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    check_tracking_uri(path)


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "sqlite:////tmp/x/mlflow.db",
                                 "sqlite://", "http://127.0.0.1:5000", "https://mlflow.example",
                                 "databricks", "databricks://profile"])
def test_uris_mlflow_takes_pass(uri):
    check_tracking_uri(uri)
