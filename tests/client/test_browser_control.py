"""Control from the MLflow UI, clicked for real: headless Chromium opens a run's page on a
``mlflow server``, adds the tag ``rapidfire.op`` = ``stop`` with the UI's own tag editor, and the
experiment, training meanwhile, stops that run at its next chunk boundary.

Needs Chromium, its driver and Selenium (skipped without them). With ``RF_SAVE_SCREENSHOT`` set,
the filled-in tag editor is saved to ``docs/img/tag_editor.png`` (the IC Ops guide's picture).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from browser import chromium
from held_run import HeldRun
from mlflow_server import mlflow_server

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

pytestmark = pytest.mark.slow

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "tag_editor.png"
LRS = [1e-3, 3e-3, 1e-4]  # run-0, run-1, run-2
TARGET, TARGET_LR = "run-1", 3e-3
MAX_STEPS, CHUNKS = 8, 4  # 2 steps a chunk
GATE_STEP = 3  # run-1 waits here, inside its second chunk, while the person clicks



@pytest.fixture
def server(tmp_path):
    """A ``mlflow server`` on 127.0.0.1 (one worker, sqlite in tmp_path)."""
    with mlflow_server(tmp_path / "mlflow.db") as url:
        yield url


@pytest.fixture
def browser():
    with chromium(1400, 900) as driver:
        yield driver


def _wait_for(what: str, condition, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _click_when_ready(element, timeout: float = 30.0) -> None:
    """Click, trying again while the page still lays itself out (Chromium answers "not
    interactable" for an element under an animation even after it reported it clickable)."""
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        ElementNotInteractableException,
    )

    deadline = time.monotonic() + timeout
    while True:
        try:
            element.click()
            return
        except (ElementNotInteractableException, ElementClickInterceptedException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def _add_tag_in_ui(driver, url: str, exp_id: str, run_id: str, key: str, value: str,
                   screenshot: Path | None) -> None:
    """What a person does: open the run, click the tags' edit button, fill key and value, add
    the tag, save."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 60)
    edit_tags = (By.CSS_SELECTOR, "button[aria-label='Edit tags']")  # the pencil by the tags
    driver.get(f"{url}/#/experiments/{exp_id}/runs/{run_id}")
    wait.until(ec.element_to_be_clickable(edit_tags))
    # MLflow 3 opens an assistant side panel: close it, if it is there, for a clean picture
    # (the page then lays itself out again, so the edit button is looked up afresh).
    for close in driver.find_elements(By.CSS_SELECTOR,
                                      "[data-assistant-ui] button[aria-label='Close']"):
        if close.is_displayed():
            close.click()
    wait.until(ec.element_to_be_clickable(edit_tags)).click()
    # The tag editor is the dialog with a Value field (another panel of the page may also be
    # a dialog); its key field takes clicks only once the dialog's opening animation is over.
    editor = "//*[@role='dialog'][.//input[@aria-label='Value']]"
    dialog = wait.until(ec.visibility_of_element_located((By.XPATH, editor)))
    # The key field is a searchable select: type a new key, Enter picks "Add tag <key>".
    key_box = wait.until(ec.element_to_be_clickable(
        (By.XPATH, f"{editor}//input[@role='combobox']")))
    _click_when_ready(key_box)
    key_box.send_keys(key)
    wait.until(ec.presence_of_element_located(
        (By.XPATH, f"//*[@role='option' and contains(normalize-space(), '{key}')]")))
    key_box.send_keys(Keys.ENTER)
    dialog.find_element(By.CSS_SELECTOR, "input[aria-label='Value']").send_keys(value)
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(screenshot))
    dialog.find_element(By.CSS_SELECTOR, "button[aria-label='Add tag']").click()
    # The new tag shows in the dialog as a chip titled with its key, then "Save tags" writes it.
    wait.until(ec.visibility_of_element_located(
        (By.XPATH, f"//*[@role='dialog']//*[@role='status' and @title='{key}']")))
    wait.until(ec.element_to_be_clickable(
        (By.XPATH, "//*[@role='dialog']//button[normalize-space()='Save tags']"))).click()
    wait.until(ec.invisibility_of_element_located((By.CSS_SELECTOR, "[role='dialog']")))
    # Saved: the run page's tags now include it.
    wait.until(ec.visibility_of_element_located(
        (By.XPATH, f"//*[@role='status' and @title='{key}']")))


def test_a_stop_set_in_the_ui_tag_editor_stops_the_run_at_its_next_boundary(
        browser, server, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    gate = HeldRun(TARGET_LR, GATE_STEP, {TARGET})
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List(LRS),
                         **{**cpu_training_kwargs(), "report_to": "mlflow"},
                         per_device_train_batch_size=4, num_chunks=CHUNKS, max_steps=MAX_STEPS),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4),
        callbacks=[gate],
    )
    gate.trainer = rf
    rf.train(blocking=False)
    try:
        client = MlflowClient(server)
        # The experiment and its runs are made on the tracking thread, not before train()
        # returns to the script: a person opening the UI a moment later finds them.
        _wait_for("the experiment in MLflow",
                  lambda: client.get_experiment_by_name("exp") is not None, timeout=60)
        exp_id = client.get_experiment_by_name("exp").experiment_id
        # The person opens the experiment while the runs train (the UI's scripts load
        # meanwhile); the run's page is then a navigation inside the app.
        browser.get(f"{server}/#/experiments/{exp_id}")
        assert gate.reached.wait(timeout=180), "run-1 never reached its gate step"
        (run,) = client.search_runs([exp_id], f"tags.`rapidfire.run` = '{TARGET}'")
        run_id = run.info.run_id
        # The run is in flight as the UI shows it (tags go out every two seconds).
        _wait_for("run-1's running status in MLflow", lambda: client.get_run(
            run_id).data.tags.get("rapidfire.status") == "running", timeout=30)
        try:
            _add_tag_in_ui(browser, server, exp_id, run_id, "rapidfire.op", "stop",
                           SCREENSHOT if os.environ.get("RF_SAVE_SCREENSHOT") else None)
        except Exception:
            browser.save_screenshot(str(tmp_path / "failure.png"))
            (tmp_path / "failure.html").write_text(browser.page_source, encoding="utf-8")
            raise
        assert client.get_run(run_id).data.tags.get("rapidfire.op") == "stop"
    finally:
        gate.release.set()
        rf.wait(timeout=300)
    assert not rf.training and not gate.timed_out

    # Applied at the end of the chunk the tag landed in: step 4 of 8.
    assert [(r.source, r.run, r.op, r.result) for r in rf.op_log] == [
        ("tag", TARGET, "stop", "ok: stopped at step 4")]
    runs = {r.name: r for r in rf.runs}
    assert runs[TARGET].status == RunStatus.STOPPED
    assert runs[TARGET].global_step == 4 < MAX_STEPS
    for name in ("run-0", "run-2"):
        assert runs[name].status == RunStatus.COMPLETED and runs[name].global_step == MAX_STEPS

    # And the store says so, where the UI reads it.
    tracker = rf.engine.tracker
    for name, rf_status, status in ((TARGET, "stopped", "FINISHED"),  # stopped as meant
                                    ("run-0", "completed", "FINISHED"),
                                    ("run-2", "completed", "FINISHED")):
        got = client.get_run(tracker.run_id(name))
        assert got.info.status == status, name
        assert got.data.tags["rapidfire.status"] == rf_status, name
    tags = client.get_run(run_id).data.tags
    assert tags["rapidfire.op.result"].startswith("ok: stopped at step"), tags
    assert "rapidfire.op" not in tags  # taken: the run's tag is free for the next op
