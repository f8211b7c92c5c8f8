"""The control panel's server side (the MLflow app plugin), through Flask's test client: the
page and its files, nothing else of the package; the op check answers as every sender's
check does; the clone form's locked fields; bodies bounded before they are parsed."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest
from flask import Flask

from trl_rapidfire.client.panel_app import create_app


@pytest.fixture
def client():
    app = Flask("panel-test")
    assert create_app(app) is app  # not under uvicorn: the Flask app itself, routes added
    return app.test_client()


def test_the_plugin_is_the_mlflow_app_named_trl_rapidfire():
    (entry,) = [e for e in entry_points(group="mlflow.app") if e.name == "trl-rapidfire"]
    assert entry.load() is create_app


def test_serves_the_page_and_its_files_only(client):
    page = client.get("/rapidfire/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    for script in ("panel.js", "panel_curves.js", "panel_table.js", "panel_clone.js"):
        assert f'src="{script}"'.encode() in page.data
        assert client.get(f"/rapidfire/{script}").mimetype == "text/javascript"
    assert client.get("/rapidfire/panel.css").mimetype == "text/css"
    for other in ("/rapidfire/panel_app.py", "/rapidfire/..%2f__init__.py", "/rapidfire/x.js"):
        assert client.get(other).status_code == 404, other


def _post(client, path: str, doc, status: int = 200) -> dict:
    reply = client.post(f"/rapidfire/api/{path}", data=json.dumps(doc),
                        content_type="application/json")
    assert reply.status_code == status, reply.get_json()
    return reply.get_json()


def test_the_op_check_is_the_senders_check(client):
    assert _post(client, "check-op", {"run": "run-1", "op": "stop"}) == {"op": "stop"}
    op = 'clone-warm {"learning_rate": 0.0001}'
    assert _post(client, "check-op", {"run": "run-1", "op": op, "status": "running"}) == {"op": op}
    # A refused op is a 422 with the reason; a body of the wrong kind a 400.
    typo = _post(client, "check-op", {"run": "run-1", "op": "stpo"}, 422)["error"]
    assert "unknown op 'stpo'" in typo
    done = _post(client, "check-op", {"run": "run-1", "op": "stop", "status": "completed"}, 422)
    assert "completed" in done["error"]
    bomb = _post(client, "check-op", {"run": "run-1", "op": 'clone {"max_steps": 1e12}'}, 422)
    assert "MAX_TRAIN_STEPS" in bomb["error"]
    assert "must be text" in _post(client, "check-op", {"run": 3, "op": "stop"}, 400)["error"]


def test_the_clone_form_locks_what_a_tag_may_never_change(client):
    reply = _post(client, "clone-fields", {"fields": ["learning_rate", "output_dir",
                                                      "peft_config.r", "report_to"]})
    refused = {f["name"]: f["refused"] for f in reply["fields"]}
    assert refused["learning_rate"] is None and refused["peft_config.r"] is None
    assert refused["output_dir"] and refused["report_to"]
    assert "error" in _post(client, "clone-fields", {"fields": "learning_rate"}, 400)


def test_bodies_are_bounded_and_must_be_objects(client):
    big = client.post("/rapidfire/api/check-op", data=b"{" + b" " * 20000 + b"}",
                      content_type="application/json")
    assert big.status_code == 400 and "at most 16384 bytes" in big.get_json()["error"]
    assert "JSON object" in _post(client, "check-op", ["stop"], 400)["error"]
    bad = client.post("/rapidfire/api/check-op", data=b"{not json",
                      content_type="application/json")
    assert bad.status_code == 400 and bad.get_json()["error"].startswith("bad request")
    # Nested past the parser's depth bound: refused as bad text, not a server error.
    deep = client.post("/rapidfire/api/check-op", data=b"[" * 16000,
                       content_type="application/json")
    assert deep.status_code == 400 and "deep" in deep.get_json()["error"]


def test_the_pages_curves_use_the_reports_colours_and_line_styles():
    """panel.js draws each run as ``trl-rapidfire report`` does (plot_style.py): the same 20
    colours by run index and the same line-style rounds, written out in the page."""
    import re
    from importlib import resources

    from trl_rapidfire.reports.plot_style import LINE_STYLES, PALETTE

    script = resources.files("trl_rapidfire.client").joinpath("panel_static", "panel_curves.js")
    text = script.read_text()
    palette = re.search(r"const PALETTE = \[(.*?)\];", text, re.S).group(1)
    assert tuple(re.findall(r'"(#[0-9a-f]{6})"', palette)) == PALETTE
    dashes = re.search(r"const DASHES = \[(.*)\];\s*//(.*)", text)
    assert tuple(re.findall(r'"([^"]+)"', dashes.group(2))) == LINE_STYLES
