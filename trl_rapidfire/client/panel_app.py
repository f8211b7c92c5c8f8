"""The control panel: buttons to steer an experiment, served by the MLflow server itself.

An MLflow *app plugin* (entry point ``mlflow.app`` named ``trl-rapidfire``): ``mlflow server
--app-name trl-rapidfire`` (``trl-rapidfire dashboard`` starts it so) adds the panel at
``/rapidfire/`` on the UI's own host and port. The page is static; what it writes goes through
MLflow's own REST API from the browser (``runs/set-tag``), with the UI's origin, and it lists
experiments with MLflow's ``experiments/search`` and ``runs/search``. So the panel opens no new
way in: a button does what a person editing the run's ``rapidfire.op`` tag in the UI does, and
works the same against a remote tracking server that has the plugin installed. One limit:
``mlflow server`` runs one app, so a server that needs MLflow's own login (``--app-name
basic-auth``) cannot serve this panel as well; started with ``--app-name trl-rapidfire``
instead, it has no login (docs/control-panel.md says so).

The server side adds two read-only answers the page asks before it sets a tag, so that a typo
is said at once instead of later in the run's answer tag:

* ``POST /rapidfire/api/check-op`` ``{"run", "op", "status"}``: the op checked as every
  sender checks it (:func:`~trl_rapidfire.client.send.check_op`): ``{"op"}``, or an op that
  would be refused, ``422`` with ``{"error"}``.
* ``POST /rapidfire/api/clone-fields`` ``{"fields": [...]}``: which knob names a tag may never
  change, whatever the value (:func:`~trl_rapidfire.control.trust.refused_by_name`), so the
  clone form shows them locked with the reason.

A body that is not what the route takes (too large, not a JSON object, a field of the wrong
type) is ``400`` with ``{"error": "bad request: ..."}``: an error is never a ``200``.

Both take small JSON bodies only (bounded before parsing) and never touch the store.

And reads of the store, in place of MLflow's ``runs/search`` (which answers every run's whole
config): ``/rapidfire/api/runs`` (``GET ?experiment=<id>&rfid=<id>``, or ``POST`` with those
and what the page holds), an experiment's runs as the table and curves need them, only what
moved since the page's last refresh (:mod:`.panel_runs`); ``GET /rapidfire/api/why`` (same
query, and the ``metric`` ranked by), each knob's importance for that metric and the knobs as
parallel axes (:mod:`.panel_why`); and ``GET /rapidfire/api/view`` (same query), the saved
view of MLflow's runs table for that experiment (:mod:`.mlflow_view`), which the page sets
through MLflow's own ``experiments/set-experiment-tag`` where it is missing. A bad query is
``400`` with ``{"error"}``. Nothing the plugin adds can write: the panel's ops and the view go
through MLflow's own REST API.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any

__all__ = ["PANEL_PATH", "create_app", "panel_blueprint"]

PANEL_PATH = "/rapidfire/"
# The files the page is made of (nothing else is served from the package).
_JS = "text/javascript; charset=utf-8"
_FILES = {"index.html": "text/html; charset=utf-8", "panel.css": "text/css; charset=utf-8",
          "panel.js": _JS, "panel_curves.js": _JS, "panel_table.js": _JS, "panel_clone.js": _JS,
          "panel_why.js": _JS, "panel_rank.js": _JS}
_MAX_BODY = 16 * 1024
_MAX_OP = 5000
_MAX_FIELDS = 200


def _static(name: str) -> bytes:
    return resources.files("trl_rapidfire.client").joinpath("panel_static", name).read_bytes()


def _body(request: Any, limit: int = _MAX_BODY) -> dict[str, Any]:
    """The request's JSON object, bounded (to ``limit`` bytes) before it is parsed."""
    length = request.content_length
    if length is None or length > limit:
        raise ValueError(f"a JSON body of at most {limit} bytes is expected")
    from ..storage.outside_text import loads

    # Bounded in depth too: a body of 16 KiB of "[" would exhaust the parser's recursion.
    doc = loads(request.get_data(cache=False)[:limit], what="the request body",
                max_bytes=limit)
    if not isinstance(doc, dict):
        raise ValueError("a JSON object is expected")
    return doc


def _text(doc: dict[str, Any], key: str, limit: int) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"{key!r} must be text of at most {limit} characters")
    return value


def check_op_answer(doc: dict[str, Any]) -> dict[str, str]:
    """The answer of ``/rapidfire/api/check-op`` to ``doc``: ``{"op"}``, or ``{"error"}``
    for an op that would be refused. Raises ``ValueError`` for a body that is not
    ``{"run", "op", "status"}`` of text."""
    from ..control.ops import OpError
    from .send import check_op

    # A body field of the wrong kind is a bad request (raised); the op's refusal is the answer.
    op, run = _text(doc, "op", _MAX_OP), _text(doc, "run", 200)
    status = _text(doc, "status", 40) if doc.get("status") is not None else None
    try:
        check_op(run, op, status)
    except (OpError, LookupError, ValueError) as err:
        return {"error": str(err)}
    return {"op": op}


def clone_fields_answer(doc: dict[str, Any]) -> dict[str, Any]:
    """The answer of ``/rapidfire/api/clone-fields`` to ``doc``."""
    from ..control.trust import refused_by_name

    fields = doc.get("fields")
    if (not isinstance(fields, list) or len(fields) > _MAX_FIELDS
            or not all(isinstance(f, str) and len(f) <= 250 for f in fields)):
        return {"error": f"'fields' must be a list of at most {_MAX_FIELDS} names"}
    return {"fields": [{"name": f, "refused": refused_by_name(f)} for f in fields]}


def _served_store() -> Any:
    """The tracking store the MLflow server serves (its handlers' own, made from the
    ``--backend-store-uri`` that ``mlflow server`` passes its app in the environment)."""
    from mlflow.server.handlers import _get_tracking_store

    return _get_tracking_store()


def panel_blueprint(store: Any = None) -> Any:
    """The panel's routes, as a Flask blueprint (MLflow's server is a Flask app). ``store``:
    the tracking store ``/api/runs`` reads (default: the one the server serves)."""
    from flask import Blueprint, Response, abort, request

    from .mlflow_view import view_answer
    from .panel_runs import MAX_HELD, parse_query, runs_answer
    from .panel_why import why_answer

    prefix = os.environ.get("_MLFLOW_STATIC_PREFIX", "").rstrip("/")
    blueprint = Blueprint("trl_rapidfire_panel", __name__, url_prefix=prefix + "/rapidfire")

    def page(name: str) -> Response:
        if name not in _FILES:
            abort(404)
        response = Response(_static(name), mimetype=_FILES[name].split(";")[0])
        response.headers["Content-Type"] = _FILES[name]
        response.headers["Cache-Control"] = "no-cache"
        return response

    @blueprint.get("/")
    def index() -> Response:
        return page("index.html")

    @blueprint.get("/<name>")
    def asset(name: str) -> Response:
        return page(name)

    def answer(compute: Any, refused: int) -> Response:
        status = 200
        try:
            reply = compute(_body(request))
        except ValueError as err:  # includes a JSON syntax error
            reply, status = {"error": f"bad request: {err}"}, 400
        else:
            if "error" in reply:  # what the body asked is refused: say so in the status too
                status = refused
        return Response(json.dumps(reply), status=status, mimetype="application/json")

    @blueprint.post("/api/check-op")
    def check() -> Response:
        return answer(check_op_answer, 422)

    @blueprint.post("/api/clone-fields")
    def clone_fields() -> Response:
        return answer(clone_fields_answer, 400)

    def read(compute: Any) -> Response:
        try:  # the query string, or (for the page's `held`, which can be long) a JSON body
            args = request.args if request.method == "GET" else _body(request, MAX_HELD + 1024)
            query = parse_query(args)
        except ValueError as err:
            return Response(json.dumps({"error": f"bad request: {err}"}), status=400,
                            mimetype="application/json")
        reply = compute(store if store is not None else _served_store(), query)
        response = Response(json.dumps(reply, separators=(",", ":")),
                            mimetype="application/json")
        response.headers["Cache-Control"] = "no-store"
        return response

    @blueprint.route("/api/runs", methods=["GET", "POST"])
    def runs() -> Response:
        return read(runs_answer)

    @blueprint.get("/api/why")
    def why() -> Response:
        return read(why_answer)

    @blueprint.get("/api/view")
    def view() -> Response:
        return read(view_answer)

    return blueprint


def create_app(app: Any = None, store: Any = None) -> Any:
    """MLflow's server with the panel added (the ``mlflow.app`` entry point's factory).

    MLflow serves its Flask app through uvicorn wrapped in its FastAPI app (its default), or
    directly under gunicorn or waitress: the same wrapping as MLflow's own ``basic-auth`` app.
    ``store``: the tracking store the panel's ``/api/runs`` reads (a test's; default: the
    server's own).
    """
    if app is None:
        from mlflow.server import app as mlflow_app

        app = mlflow_app
    app.register_blueprint(panel_blueprint(store))
    if os.environ.get("_MLFLOW_SGI_NAME") == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
