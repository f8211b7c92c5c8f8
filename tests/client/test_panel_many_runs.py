"""The control panel at 100 runs, in headless Chromium at 1280 px: the experiment is written
into a sqlite MLflow store by the Tracker (no training), ``mlflow server --app-name
trl-rapidfire`` serves it. The top 10 runs by loss are drawn in colour and named at their
lines' ends; hovering a row lights its curve and hovering a curve its row; a pinned run stays
pinned across refreshes; the text and status filters narrow the table and the curves; nothing
scrolls sideways and no button is cut; the clone form edits ``peft_config.r`` field by field
and the op tag it sets says so. With ``RF_SAVE_SCREENSHOT`` set, it saves
``docs/img/control_panel_many.png`` and ``docs/img/clone_form.png``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from browser import chromium
from mlflow_server import mlflow_server
from panel_store import loss_of, write_store

pytestmark = pytest.mark.slow

RUNS = 100
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("panel-many")
    uri, tracker = write_store(folder, RUNS)
    try:
        with mlflow_server(folder / "mlflow.db", app_name="trl-rapidfire") as url, \
                chromium(1280, 900) as driver:
            driver.get(f"{url}/rapidfire/")
            _wait(driver, lambda d: _js(d, "return document.querySelectorAll('#rows tr').length")
                  == RUNS and _js(d, "return document.querySelectorAll('path.curve').length")
                  == RUNS, "the 100 runs and their curves")
            yield driver, tracker, uri
    finally:
        tracker.close(parent_status=None)


def _js(driver, script, *args):
    return driver.execute_script(script, *args)


def _wait(driver, condition, what, timeout=60.0):
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)
    except Exception as err:
        raise AssertionError(f"timed out waiting for {what}") from err


def _click(driver, selector):
    """A real click on ``selector``, scrolled to the middle of its box first (the table's
    sticky header would take a click at the box's top edge)."""
    found = driver.find_element("css selector", selector)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", found)
    found.click()


def _refreshed(driver):
    """Waits for the page's next refresh."""
    seen = _js(driver, "return window.rfPanel.refreshes")
    _wait(driver, lambda d: _js(d, "return window.rfPanel.refreshes") > seen, "a refresh")


def _coloured(driver) -> list[str]:
    return _js(driver, "return [...document.querySelectorAll('path.curve.coloured')]"
                       ".map((p) => p.dataset.run)")


def test_the_top_10_by_loss_are_coloured_and_named_at_their_ends(panel):
    driver, _tracker, _uri = panel
    best = sorted(range(RUNS), key=lambda i: loss_of(i, 20))[:10]
    assert sorted(_coloured(driver)) == sorted(f"run-{i}" for i in best)
    greys = _js(driver, "return [...document.querySelectorAll('path.curve:not(.coloured)')]"
                        ".map((p) => p.getAttribute('stroke'))")
    assert len(greys) == RUNS - 10 and set(greys) == {"#c4c9cf"}
    labels = _js(driver, "return [...document.querySelectorAll('#curves .end-label')]"
                         ".map((t) => t.textContent)")
    assert sorted(labels) == sorted(f"run-{i}" for i in best)
    # k is the person's: 3 runs in colour.
    box = driver.find_element("id", "top-k")
    box.clear()
    box.send_keys("3\n")
    _wait(driver, lambda d: len(_coloured(d)) == 3, "three coloured curves")
    box.clear()
    box.send_keys("10\n")
    _wait(driver, lambda d: len(_coloured(d)) == 10, "ten coloured curves again")


def test_hovering_a_row_lights_its_curve_and_a_curve_its_row(panel):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    driver, _tracker, _uri = panel
    row = driver.find_element("css selector", "tr[data-run='run-50'] td.c-status")
    ActionChains(driver).move_to_element(row).perform()
    _wait(driver, lambda d: "run-50" in _coloured(d), "run-50's curve lit")
    assert _js(driver, "return document.querySelector(\"path.curve[data-run='run-50']\")"
                       ".getAttribute('stroke-width')") == "3"
    # A point of a grey curve, where the pointer then is: the curve on top there lights its row.
    driver.execute_script("document.getElementById('curves').scrollIntoView()")
    x, y = _js(driver, """
        const hit = document.querySelector("path.hit[data-run='run-61']");
        const p = hit.getPointAtLength(hit.getTotalLength() * 0.3);
        const m = hit.getScreenCTM();
        return [Math.round(p.x * m.a + m.e), Math.round(p.y * m.d + m.f)];""")
    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(x, y)
    actions.perform()
    under = _js(driver, "const e = document.elementFromPoint(arguments[0], arguments[1]);"
                        " return e && e.dataset.run", x, y)
    assert under and under != "run-50"
    _wait(driver, lambda d: _js(d, "return document.querySelector(arguments[0]).classList"
                                ".contains('hot')", f"tr[data-run='{under}']"),
          f"{under}'s row lit")
    assert _js(driver, "return document.querySelector(arguments[0]).getAttribute('stroke-width')",
               f"path.curve[data-run='{under}']") == "3"
    assert "run-50" not in _coloured(driver)  # 50 % 7 = 1: lit only while hovered


def test_a_pinned_run_stays_pinned_across_refreshes(panel):
    from selenium.webdriver.common.action_chains import ActionChains

    driver, tracker, _uri = panel
    _click(driver, "tr[data-run='run-43'] td.c-progress")
    tracker.set_tags("run-43", {"rapidfire.progress": "chunk 2/4 (step 30)"})
    tracker.flush(timeout=60)
    _wait(driver, lambda d: d.find_element("css selector", "tr[data-run='run-43'] td.c-progress")
          .text.startswith("chunk 2/4"), "run-43's row updated")
    _refreshed(driver)
    assert "pinned" in driver.find_element("css selector", "tr[data-run='run-43']")\
        .get_attribute("class")
    assert "run-43" in _coloured(driver)  # 43 % 7 = 1: not in the top 10, coloured as pinned
    _click(driver, "tr[data-run='run-43'] td.c-progress")
    _wait(driver, lambda d: "pinned" not in d.find_element(
        "css selector", "tr[data-run='run-43']").get_attribute("class"), "run-43 unpinned")
    ActionChains(driver).move_to_element(driver.find_element("id", "filter")).perform()
    _wait(driver, lambda d: "run-43" not in _coloured(d), "run-43 grey again")


def _shown(driver) -> tuple[int, int]:
    return (_js(driver, "return document.querySelectorAll('#rows tr:not([hidden])').length"),
            _js(driver, "return document.querySelectorAll('path.curve').length"))


def test_the_filters_narrow_the_table_and_the_curves(panel):
    driver, _tracker, _uri = panel
    box = driver.find_element("id", "filter")
    box.send_keys("peft_config.r=16")  # run i has r = 4 << (i % 3): 16 for i % 3 == 2
    _wait(driver, lambda d: _shown(d) == (33, 33), "33 runs of r=16")
    box.send_keys(" run-5")  # and a name: run-5, run-50..59 with i % 3 == 2
    want = [i for i in [5, *range(50, 60)] if i % 3 == 2]
    _wait(driver, lambda d: _shown(d) == (len(want), len(want)), "r=16 and run-5*")
    box.clear()
    # key=value is the knob's value, numbers as numbers: run i's rate is 10 ** -(2 + i % 4),
    # and "0.001" is neither 0.0001 nor 1e-05 (once a substring of both).
    box.send_keys("learning_rate=0.001")
    _wait(driver, lambda d: _shown(d) == (RUNS // 4, RUNS // 4), "the runs of rate 1e-3")
    box.clear()
    box.send_keys("learning_rate=1e-3")
    _wait(driver, lambda d: _shown(d) == (RUNS // 4, RUNS // 4), "1e-3 as a number")
    box.clear()
    box.send_keys(" ")
    _wait(driver, lambda d: _shown(d) == (RUNS, RUNS), "all runs again")
    failed = driver.find_element("css selector", "#status-filters input[data-status='failed']")
    failed.click()  # statuses go in turn: run i is failed for i % 4 == 3
    _wait(driver, lambda d: _shown(d) == (75, 75), "the failed runs hidden")
    assert not _js(driver, "return [...document.querySelectorAll('#rows tr:not([hidden])"
                           " td.c-status')].some((c) => c.textContent === 'failed')")
    failed.click()
    _wait(driver, lambda d: _shown(d) == (RUNS, RUNS), "the failed runs back")


def test_nothing_scrolls_sideways_and_no_button_is_cut(panel):
    driver, _tracker, _uri = panel
    assert _js(driver, "return window.innerWidth") <= 1280
    assert _js(driver, "return document.scrollingElement.scrollWidth <= window.innerWidth")
    cut = _js(driver, """
        return [...document.querySelectorAll('#rows button')].filter((b) => {
          const r = b.getBoundingClientRect(), c = b.closest('td').getBoundingClientRect();
          return b.scrollWidth > b.clientWidth || r.right > c.right + 0.5 || r.left < c.left
            || r.right > window.innerWidth;
        }).map((b) => b.getAttribute('aria-label'));""")
    assert cut == []
    # The knob columns are the fields that differ, not the config object's text.
    heads = _js(driver, "return [...document.querySelectorAll('#head th')]"
                        ".map((t) => t.textContent)")
    assert {"learning_rate", "peft_config.r", "peft_config.lora_alpha"} <= set(heads)
    assert "peft_config" not in heads and "peft_config.target_modules" not in heads
    if os.environ.get("RF_SAVE_SCREENSHOT"):
        from selenium.webdriver.common.action_chains import ActionChains

        _click(driver, "tr[data-run='run-22'] td.c-progress")
        ActionChains(driver).move_to_element(
            driver.find_element("css selector", "tr[data-run='run-36'] td.c-status")).perform()
        driver.execute_script("window.scrollTo(0, 0)")
        _refreshed(driver)
        IMG.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(IMG / "control_panel_many.png"))
        _click(driver, "tr[data-run='run-22'] td.c-progress")


def test_the_clone_form_changes_a_lora_field_one_by_one(panel):
    from mlflow import MlflowClient

    driver, _tracker, uri = panel
    _click(driver, "button[data-run='run-4'][data-op='clone']")
    form = _wait(driver, lambda d: d.find_element("id", "clone-form").is_displayed()
                 and d.find_element("id", "clone-form"), "the clone form")
    rank = form.find_element("css selector", "input[data-field='peft_config.r']")
    assert rank.get_attribute("type") == "number" and rank.get_attribute("value") == "8"
    assert form.find_element("css selector", "input[data-field='peft_config.lora_alpha']")\
        .get_attribute("value") == "8"
    warm = form.find_element("xpath", "//input[@id='clone-warm']/..").text
    assert "parent's weights and optimizer state" in warm
    assert "step count and learning-rate schedule" in warm and "restart" in warm
    rank.clear()
    rank.send_keys("16")
    if os.environ.get("RF_SAVE_SCREENSHOT"):
        driver.execute_script("arguments[0].scrollIntoView()", form)
        form.screenshot(str(IMG / "clone_form.png"))
    form.find_element("id", "clone-send").click()
    _wait(driver, lambda d: "clone" in d.find_element("css selector", "td[data-answer='run-4']")
          .text, "the clone shown as sent")
    run_id = _js(driver, "return window.rfPanel.runs.find((r) => r.name === 'run-4').id")

    def tagged(_):
        return MlflowClient(uri).get_run(run_id).data.tags.get("rapidfire.op")

    op = _wait(driver, tagged, "the op tag")
    verb, overrides = op.split(maxsplit=1)
    assert verb == "clone" and json.loads(overrides) == {"peft_config.r": 16}


def test_the_why_view_shows_importance_and_a_line_per_run_across_the_knobs(panel):
    driver, _tracker, _uri = panel
    _click(driver, "#why-view summary")
    _wait(driver, lambda d: _js(d, "return document.querySelectorAll('#parallel "
                                   "polyline.parallel-line').length") == RUNS,
          "a line per run", timeout=90)
    knobs = _js(driver, "return [...document.querySelectorAll('#importance tbody td.field-name')]"
                        ".map((t) => t.textContent)")
    assert {"learning_rate", "peft_config.r", "peft_config.lora_alpha"} == set(knobs)
    axes = _js(driver, "return [...document.querySelectorAll('#parallel .axis-name')]"
                       ".map((t) => t.textContent)")
    assert "learning_rate (log)" in axes and axes[-1] == "loss"  # the objective last
    # Coloured as the curves are: the same top 10 runs.
    lines = _js(driver, "return [...document.querySelectorAll('#parallel polyline.coloured')]"
                        ".map((p) => p.dataset.run)")
    assert sorted(lines) == sorted(_coloured(driver))
    # A line is taken from 3 px off it (its wide invisible twin): the pointer there lights
    # its run's row and widens the line. The topmost line, mid first segment.
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    driver.execute_script("document.getElementById('parallel').scrollIntoView()")
    run, x, y = _js(driver, """
        const pair = document.querySelector('#parallel-lines').lastElementChild;
        const line = pair.querySelector('.parallel-line');
        const [a, b] = [line.points[0], line.points[1]];
        const m = line.getScreenCTM();
        const px = (a.x + b.x) / 2, py = (a.y + b.y) / 2 + 3;
        return [pair.dataset.run, Math.round(px * m.a + m.e), Math.round(py * m.d + m.f)];""")
    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(x, y)
    actions.perform()
    _wait(driver, lambda d: _js(d, "return document.querySelector(arguments[0]).classList"
                                ".contains('hot')", f"tr[data-run='{run}']"), f"{run}'s row lit")
    assert _js(driver, "return document.querySelector(arguments[0]).getAttribute('stroke-width')",
               f"polyline.parallel-line[data-run='{run}']") == "3"
    if os.environ.get("RF_SAVE_SCREENSHOT"):
        view = driver.find_element("id", "why-view")
        driver.execute_script("arguments[0].scrollIntoView()", view)
        view.screenshot(str(IMG / "panel_why.png"))
    _click(driver, "#why-view summary")
