"""The control panel, clicked for real: headless Chromium opens the panel an MLflow server
serves (its app plugin, ``--app-name trl-rapidfire``), stops a running run with its Stop
button, clones another with a changed learning rate and a warm start from the clone form, and
sees both answers next to the runs; the experiment, training meanwhile, applied both (its op
log, ``ops.csv`` and the runs' tags say so).

Twice: with the server ``trl-rapidfire dashboard`` starts on a sqlite store (following the
link it prints), and with a plain ``mlflow server --app-name trl-rapidfire`` the experiment
tracks to over HTTP (a remote tracking server). Needs Chromium, its driver and Selenium
(skipped without them). With ``RF_SAVE_SCREENSHOT`` set, the first saves the panel to
``docs/img/control_panel.png``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
from pathlib import Path

import pytest
from browser import chromium
from dashboard_process import Dashboard
from held_run import HeldRun
from mlflow_server import free_port, mlflow_server

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

pytestmark = pytest.mark.slow

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "control_panel.png"
LRS = [1e-3, 3e-3, 2e-3]  # run-0, run-1, run-2
STOPPED, STOPPED_LR = "run-1", 3e-3
PARENT, CLONE_LR = "run-0", 1e-4
MAX_STEPS, CHUNKS = 8, 4  # 2 steps a chunk
GATE_STEP = 3  # run-1 waits here, inside its second chunk, while the person clicks


def _wait(driver, condition, what: str, timeout: float = 120.0):
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def probe(d):
        try:  # the table is redrawn every refresh: an element may go stale between looks
            return condition(d)
        except StaleElementReferenceException:
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(probe, what)
    except WebDriverException as err:
        raise AssertionError(f"timed out waiting for {what}") from err


def _answer(driver, run: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f"td[data-answer='{run}']")
    return found[0].text if found else ""


def _status(driver, run: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f"tr[data-run='{run}'] td.status")
    return found[0].text if found else ""


def _click(driver, run: str, op: str) -> None:
    from selenium.webdriver.common.by import By

    def clicked(d):
        button = d.find_element(By.CSS_SELECTOR, f"button[data-run='{run}'][data-op='{op}']")
        if not button.is_enabled():
            return False
        button.click()
        return True

    _wait(driver, clicked, f"{op} of {run} to be clickable")


def _steer_in_panel(driver, panel: str, gate: HeldRun, screenshot: Path | None) -> None:
    """What the person does in the panel: stop run-1, clone run-0 at a lower learning rate,
    warm; then read both answers."""
    from selenium.webdriver.common.by import By

    driver.get(panel)
    assert gate.reached.wait(timeout=180), "run-1 never reached its gate step"
    _wait(driver, lambda d: _status(d, STOPPED) == "running", "run-1 shown running")
    _click(driver, STOPPED, "stop")
    _wait(driver, lambda d: _answer(d, STOPPED).startswith(("sent: stop", "waiting: stop")),
          "the stop shown as sent")
    _click(driver, PARENT, "clone")
    form = _wait(driver, lambda d: d.find_element(By.ID, "clone-form").is_displayed()
                 and d.find_element(By.ID, "clone-form"), "the clone form")
    lr = form.find_element(By.CSS_SELECTOR, "input[data-field='learning_rate']")
    assert float(lr.get_attribute("value")) == LRS[0]  # the parent's value, to change
    lr.clear()
    lr.send_keys("1e-4")
    form.find_element(By.ID, "clone-warm").click()
    form.find_element(By.ID, "clone-send").click()
    _wait(driver, lambda d: "clone-warm" in _answer(d, PARENT), "the clone shown as sent")
    gate.release.set()
    # The answers, as the experiment wrote them, next to the runs; and the clone's row.
    _wait(driver, lambda d: _answer(d, STOPPED).startswith("ok: stopped at step"),
          "run-1's answer", timeout=300)
    _wait(driver, lambda d: _answer(d, PARENT).startswith("ok"), "run-0's answer", timeout=300)
    _wait(driver, lambda d: _status(d, "run-3") != "", "the clone's row", timeout=300)
    # The live curves: a line per run that logged a loss, named at its end (4 runs: all in
    # the top 10, all in colour).
    _wait(driver, lambda d: {"run-0", "run-1", "run-2"} <= {
        s.text for s in d.find_elements(By.CSS_SELECTOR, "#curves .end-label")}, "the curves")
    # Once the clone has trained too, every run's curve reaches its last logged step (the
    # histories of the runs that moved are fetched again), the clone's included.
    _wait(driver, lambda d: _status(d, "run-3") == "completed", "the clone done", 300)
    _wait(driver, lambda d: d.execute_script(
        "const s = window.rfPanel; return s.runs.length === 4 && s.runs.every((r) =>"
        " r.metrics.loss && s.history[r.id] && s.history[r.id].step === r.metrics.loss.step"
        " && s.history[r.id].points.length > 0)"), "every run's whole curve", 60)
    _wait(driver, lambda d: {"run-0", "run-1", "run-2", "run-3"} <= {
        s.text for s in d.find_elements(By.CSS_SELECTOR, "#curves .end-label")},
        "the clone's curve")
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(screenshot))


def _experiment(tmp_path: Path) -> tuple[RFSFTTrainer, HeldRun]:
    gate = HeldRun(STOPPED_LR, GATE_STEP, {STOPPED, PARENT})
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List(LRS),
                         **{**cpu_training_kwargs(), "report_to": "mlflow"},
                         per_device_train_batch_size=4, num_chunks=CHUNKS, max_steps=MAX_STEPS,
                         logging_steps=1),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4),
        callbacks=[gate],
    )
    gate.trainer = rf
    return rf, gate


def _check_applied(rf: RFSFTTrainer, uri: str, output_dir: Path) -> None:
    from mlflow import MlflowClient

    log = {(r.run, r.op.split()[0]): r for r in rf.op_log}
    assert log[(STOPPED, "stop")].source == "tag"
    assert log[(STOPPED, "stop")].result == "ok: stopped at step 4"
    clone = log[(PARENT, "clone-warm")]
    assert clone.source == "tag" and clone.result.startswith("ok"), clone
    assert json.loads(clone.op.split(maxsplit=1)[1]) == {"learning_rate": CLONE_LR}
    runs = {r.name: r for r in rf.runs}
    assert runs[STOPPED].status == RunStatus.STOPPED and runs[STOPPED].global_step == 4
    assert runs["run-3"].knobs["learning_rate"] == CLONE_LR
    assert runs["run-3"].status == RunStatus.COMPLETED
    assert rf.engine.slots["run-3"].state.warm_start
    with open(output_dir / "ops.csv", newline="") as f:
        rows = {(r["run"], r["op"].split()[0]): r for r in csv.DictReader(f)}
    assert rows[(STOPPED, "stop")]["result"] == "ok: stopped at step 4"
    assert rows[(PARENT, "clone-warm")]["result"].startswith("ok")
    client = MlflowClient(uri)
    tracker = rf.engine.tracker
    stopped = client.get_run(tracker.run_id(STOPPED)).data.tags
    assert stopped["rapidfire.op.result"] == "ok: stopped at step 4"
    assert "rapidfire.op" not in stopped
    made = client.get_run(tracker.run_id("run-3")).data
    assert made.tags["rapidfire.parent"] == PARENT and made.tags["rapidfire.warm_start"] == "true"
    assert float(made.params["learning_rate"]) == CLONE_LR


def _train_and_steer(rf: RFSFTTrainer, gate: HeldRun, driver, panel: str, tmp_path: Path,
                     screenshot: Path | None) -> None:
    rf.train(blocking=False)
    try:
        _steer_in_panel(driver, panel, gate, screenshot)
    except Exception as err:
        driver.save_screenshot(str(tmp_path / "failure.png"))
        (tmp_path / "failure.html").write_text(driver.page_source, encoding="utf-8")
        # What the page showed goes with the failure: on a CI machine tmp_path is not kept.
        with contextlib.suppress(Exception):
            from selenium.webdriver.common.by import By

            shown = driver.find_element(By.TAG_NAME, "body").text
            err.add_note("the page showed:\n" + shown[:4000])
        # The steering's error is the one to see: the experiment is asked to stop at its
        # next boundary, and an error of its own here would only hide the first.
        gate.release.set()
        rf.engine.interrupted = True
        # BaseException: the stop asked for here ends wait() with the Ctrl-C exception (a
        # KeyboardInterrupt), which would otherwise end the whole test session.
        with contextlib.suppress(BaseException):
            rf.wait(timeout=300)
        raise
    gate.release.set()
    rf.wait(timeout=300)
    assert not gate.timed_out


def test_the_dashboards_panel_stops_and_clones_with_buttons(tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    rf, gate = _experiment(tmp_path)
    # The store the dashboard opens is made on the tracking thread, once the runs are built:
    # here the dashboard starts at once, so the test waits for it.
    rf.engine.tracker.flush()
    dashboard = Dashboard(["--uri", f"sqlite:///{db}", "--port", str(free_port())], tmp_path,
                          tmp_path / "dashboard.log")
    try:
        dashboard.url()
        panel = dashboard.printed("Control panel: ")
        # MLflow's experiment page links to the panel (its description).
        from mlflow import MlflowClient

        note = MlflowClient(f"sqlite:///{db}").get_experiment_by_name("exp").tags.get(
            "mlflow.note.content", "")
        assert "(/rapidfire/#/" in note, note
        with chromium(1400, 900) as driver:
            shot = SCREENSHOT if os.environ.get("RF_SAVE_SCREENSHOT") else None
            _train_and_steer(rf, gate, driver, panel, tmp_path, shot)
    finally:
        dashboard.close()
    _check_applied(rf, f"sqlite:///{db}", tmp_path / "exp")


def test_a_tracking_servers_panel_stops_and_clones_with_buttons(tmp_path, monkeypatch):
    with mlflow_server(tmp_path / "mlflow.db", app_name="trl-rapidfire") as url:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        rf, gate = _experiment(tmp_path)
        with chromium(1400, 900) as driver:
            _train_and_steer(rf, gate, driver, f"{url}/rapidfire/", tmp_path, None)
        _check_applied(rf, url, tmp_path / "exp")
