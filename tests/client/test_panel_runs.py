"""The control panel's lean read (``GET /rapidfire/api/runs``) on a real sqlite MLflow store
the Tracker wrote: only the lean tags and the knobs of each run, then only what moved since the
page's last refresh; any other store through MLflow's own API gives the same answer; bad
queries are 400s; nothing writes."""

from __future__ import annotations

import json
import time

import pytest
from flask import Flask
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from panel_store import STATUSES, lora, loss_of, write_store

from trl_rapidfire.client.panel_app import create_app
from trl_rapidfire.client.panel_runs import LEAN_TAGS

RUNS, STEPS = 12, 20


class _ApiOnly:
    """The store seen only through MLflow's store API (no SQL tables): a non-SQL store."""

    def __init__(self, store):
        self._store = store

    def search_runs(self, *args):
        return self._store.search_runs(*args)

    def get_metric_history(self, run_id, key):
        return self._store.get_metric_history(run_id, key)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("panel-store")
    uri, tracker = write_store(folder, RUNS, STEPS)
    store = SqlAlchemyStore(uri, str(folder / "artifacts"))
    (experiment,) = [e for e in store.search_experiments() if e.name == "demo"]
    (parent,) = store.search_runs([experiment.experiment_id],
                                  "tags.`rapidfire.role` = 'experiment'", 1, 10)
    rfid = parent.data.tags["rapidfire.experiment"]
    yield tracker, store, experiment.experiment_id, rfid
    tracker.close(parent_status=None)


def _client(store):
    app = Flask("panel-runs-test")
    create_app(app, store=store)
    return app.test_client()


class _Page:
    """What the page holds between refreshes, as panel.js keeps it: each run's version and
    the step of its last loss point."""

    def __init__(self):
        self.held: dict[str, tuple[str, int]] = {}
        self.loaded = False

    def text(self) -> str:
        return ",".join(f"{i[:10]}{v}{step:x}" if step >= 0 else f"{i[:10]}{v}"
                        for i, (v, step) in self.held.items())

    def take(self, answer: dict) -> dict:
        if answer["full"]:
            self.held = {}
        self.held = {i: h for i, h in self.held.items() if i[:10] not in answer["gone"]}
        for row in answer["runs"]:
            self.held[row["id"]] = (row["v"], self.held.get(row["id"], ("", -1))[1])
        for i, points in answer["points"].items():
            self.held[i] = (self.held[i][0], points[-1][0])
        self.loaded = True
        return answer


def _get(client, experiment, rfid, page=None, status=200):
    body = {"experiment": experiment, "rfid": rfid}
    if page is not None and page.loaded:
        body["held"] = page.text()
    reply = client.post("/rapidfire/api/runs", json=body)
    assert reply.status_code == status, reply.get_data(as_text=True)[:500]
    answer = reply.get_json()
    return page.take(answer) if page is not None else answer


def test_a_first_answer_holds_each_runs_lean_row_knobs_and_curve(written):
    _tracker, store, experiment, rfid = written
    full = _get(_client(store), experiment, rfid)
    assert full["full"] is True and full["gone"] == []
    runs = {r["name"]: r for r in full["runs"]}
    assert sorted(runs) == sorted(f"run-{i}" for i in range(RUNS))
    run = runs["run-5"]
    assert set(run["tags"]) <= set(LEAN_TAGS)
    assert run["tags"]["rapidfire.status"] == STATUSES[5 % len(STATUSES)]
    assert run["loss"] == [pytest.approx(loss_of(5, STEPS)), STEPS]
    assert run["eval_loss"] is None
    # Its knobs only, not its config's 30 other settings (what runs/search would send).
    assert "setting_0" not in run["params"] and "output_dir" not in run["params"]
    assert run["params"]["learning_rate"] == json.dumps(10.0 ** -(2 + 5 % 4))
    # A config object's text comes as its fields, the names a clone op takes.
    assert "peft_config" not in run["params"]
    assert run["params"]["peft_config.r"] == str(4 << (5 % 3))
    assert run["params"]["peft_config.lora_alpha"] == str(8 << (5 % 2))
    assert json.loads(run["params"]["peft_config.target_modules"]) == ["q_proj", "v_proj"]
    points = full["points"][run["id"]]
    assert [p[0] for p in points] == list(range(1, STEPS + 1))
    assert points[-1][1] == pytest.approx(loss_of(5, STEPS), rel=1e-5)  # 6 digits sent


def test_a_trainer_kinds_own_metric_comes_in_the_rows_that_logged_it(written):
    # A reward model's runs log eval_accuracy: the page shows it in a column of its own.
    tracker, store, experiment, rfid = written
    tracker.log_metrics("run-2", [("eval_accuracy", 0.75, STEPS, int(time.time() * 1000))])
    tracker.flush(timeout=60)
    runs = {r["name"]: r for r in _get(_client(store), experiment, rfid)["runs"]}
    assert runs["run-2"]["eval_accuracy"] == [0.75, STEPS]
    assert "eval_accuracy" not in runs["run-1"] and runs["run-1"]["eval_loss"] is None


def test_a_refresh_gets_only_what_moved(written):
    tracker, store, experiment, rfid = written
    client, page = _client(store), _Page()
    first = _get(client, experiment, rfid, page)
    assert first["full"] is True and len(first["runs"]) == RUNS
    still = _get(client, experiment, rfid, page)
    assert still == {"full": False, "runs": [], "gone": [], "points": {}}
    ids = {r["name"]: r["id"] for r in first["runs"]}
    tracker.set_tags("run-3", {"rapidfire.progress": "chunk 2/4 (step 21)"})
    tracker.log_metrics("run-3", [("loss", 0.01, STEPS + 1, int(time.time() * 1000))])
    tracker.set_tags("run-4", {"rapidfire.op": "stop"})
    tracker.flush(timeout=60)
    moved = _get(client, experiment, rfid, page)
    assert sorted(r["name"] for r in moved["runs"]) == ["run-3", "run-4"]
    assert all("params" not in r for r in moved["runs"])  # the page has them already
    assert moved["points"] == {ids["run-3"]: [[STEPS + 1, 0.01]]}
    # Any server process answers so (none keeps what a page was sent): a fresh one.
    assert _get(_client(store), experiment, rfid, page)["runs"] == []
    # A new run comes with its knobs; a run the page holds that is gone is said by prefix.
    tracker.ensure_run("run-99", {"learning_rate": 0.5, "peft_config": lora(1)},
                       {"rapidfire.status": "pending",
                        "rapidfire.knobs": json.dumps(["learning_rate", "peft_config"])})
    tracker.flush(timeout=60)
    page.held["0123456789abcdef"] = ("abcdef", 3)
    new = _get(client, experiment, rfid, page)
    assert [r["name"] for r in new["runs"]] == ["run-99"] and new["gone"] == ["0123456789"]
    assert new["runs"][0]["params"]["learning_rate"] == "0.5"
    # A page that holds nothing (a first refresh, a reload) gets everything.
    again = _get(client, experiment, rfid)
    assert again["full"] is True and len(again["runs"]) == RUNS + 1


def test_any_other_store_answers_the_same_through_mlflows_api(written):
    _tracker, store, experiment, rfid = written

    def plain(answer):
        return sorted(json.dumps(r, sort_keys=True) for r in answer["runs"]), answer["points"]

    lean = _get(_client(store), experiment, rfid)
    assert plain(_get(_client(_ApiOnly(store)), experiment, rfid)) == plain(lean)


def test_bad_queries_are_400s_and_nothing_writes(written):
    _tracker, store, experiment, rfid = written
    client = _client(store)
    for query in ({"experiment": experiment}, {"experiment": "1;drop", "rfid": rfid},
                  {"experiment": experiment, "rfid": "XYZ"},
                  {"experiment": experiment, "rfid": rfid, "held": "<script>"},
                  {"experiment": experiment, "rfid": rfid, "held": "0123456789abcdefzz"},
                  {"experiment": experiment, "rfid": rfid, "limit": "5"},
                  {"experiment": "9" * 200, "rfid": rfid}):
        for reply in (client.get("/rapidfire/api/runs", query_string=query),
                      client.post("/rapidfire/api/runs", json=query)):
            assert reply.status_code == 400, query
            assert reply.get_json()["error"].startswith("bad request")
    for body in ({"experiment": 1, "rfid": rfid}, {"experiment": experiment, "rfid": rfid,
                                                   "held": ["x"]}, ["x"]):
        assert client.post("/rapidfire/api/runs", json=body).status_code == 400
    big = client.post("/rapidfire/api/runs", data=b"{" + b" " * (300 * 1024) + b"}",
                      content_type="application/json")
    assert big.status_code == 400 and "at most" in big.get_json()["error"]
    for method in (client.put, client.delete, client.patch):
        assert method("/rapidfire/api/runs").status_code == 405
    assert client.post("/rapidfire/api/why", json={}).status_code == 405
    assert _get(client, "123456", rfid)["runs"] == []  # no such experiment: no runs


def test_why_a_config_wins_is_the_reports_reading_of_the_same_runs(written):
    _tracker, store, experiment, rfid = written
    client = _client(store)
    reply = client.get("/rapidfire/api/why", query_string={"experiment": experiment,
                                                           "rfid": rfid})
    assert reply.status_code == 200
    why = reply.get_json()
    assert why["objective"] == "loss" and why["mode"] == "min" and why["method"]
    axes = {a["name"]: a for a in why["axes"]}
    # The knobs that differ, a config object by its fields; learning_rate spans 3 decades.
    assert {"learning_rate", "peft_config.r", "peft_config.lora_alpha"} <= set(axes)
    assert axes["learning_rate"]["kind"] == "log" and len(why["runs"]) == len(why["values"])
    assert all(len(a["positions"]) == len(why["runs"]) for a in why["axes"])
    # The objective of each run: its latest loss, as the table shows it.
    latest = {r["id"]: r["loss"] and r["loss"][0] for r in _get(client, experiment, rfid)["runs"]}
    assert dict(zip(why["runs"], why["values"])) == latest
    shares = dict(why["importance"])
    assert sum(shares.values()) == pytest.approx(1.0) and set(shares) <= set(axes)
    assert client.get("/rapidfire/api/why", query_string={"experiment": "x y"}).status_code \
        == 400


def test_a_knobs_tag_too_deep_or_not_a_list_reads_as_none():
    from trl_rapidfire.client.panel_runs import knob_names

    assert knob_names({"rapidfire.knobs": '["learning_rate", "peft_config"]'}) == [
        "learning_rate", "peft_config"]
    for bad in ("[" * 5000, "{not json", '{"a": 1}', '[1, 2]', "x" * 9000):
        assert knob_names({"rapidfire.knobs": bad}) is None, bad[:20]
    assert knob_names({}) is None
