"""The control panel at 128 runs in headless Chromium at 1280x800, as a SuccessiveHalving
sweep leaves a store (written by the Tracker itself, no training): 32 learning rates x LoRA
ranks 4/8/16/32 with ``lora_alpha`` at twice the rank, most runs stopped by the policy with its
long reason as their op answer, the experiment ranked by ``eval_loss`` (its runs' recorded
``rapidfire.ranking`` tag).

The table lists the runs best first by that metric, a line a run (a long answer is cut, whole
in its tooltip), 20 and more rows in sight at once, no sideways scroll; a click on a header
sorts by that column; the metric selector ranks by another metric (the table, the colours of
the curves); the "why" view takes LoRA's r and alpha as one knob; Delete asks first; the saved
view "Open in MLflow" opens is set on the experiment, sorted by the metric. At 1920 px the
progress column is not cut. With ``RF_SAVE_SCREENSHOT`` set, it saves
``docs/img/control_panel_128.png``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from browser import chromium
from mlflow_server import mlflow_server

from trl_rapidfire.reports.knob_fields import dotted_params
from trl_rapidfire.reports.ranking import RANKING_TAG, RankingMetric
from trl_rapidfire.tracking.tracker import Tracker

pytestmark = pytest.mark.slow

RUNS = 128
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
RANKING = RankingMetric("eval_loss", False, "policy", "SuccessiveHalving")
PROGRESS = "chunk 3/8 (epoch 1/2, step 30/80)"


def eval_loss_of(i: int) -> float | None:
    """Run ``i``'s latest eval_loss (the pending runs, i % 32 == 31, have none yet): spread
    so that the best is not run order (run-77 is best, then every 13th)."""
    return None if i % 32 == 31 else 1.0 + ((i * 37) % RUNS) / 100


def status_of(i: int) -> str:
    return ("pending" if i % 32 == 31 else "running" if i % 8 == 0
            else "completed" if i % 8 == 1 else "stopped")


def write_sweep(folder: Path) -> tuple[str, Tracker]:
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracker = Tracker(folder / "sweep", uri=uri)
    now = int(time.time() * 1000)
    base = {f"setting_{k}": k for k in range(30)}
    for i in range(RUNS):
        rank = 4 << (i % 4)
        params = dict(base, learning_rate=round(1e-4 * (1 + i // 4), 6),
                      output_dir=f"out/runs/run-{i}", per_device_train_batch_size=4,
                      peft_config=f"LoraConfig(r={rank}, alpha={2 * rank}, "
                                  "targets=['q_proj', 'v_proj'])")
        # The config object's fields as params of their own, as trainers/run_builder.py logs.
        params.update(dotted_params({"peft_config": params["peft_config"]}))
        tags = {"rapidfire.status": status_of(i), "rapidfire.progress": PROGRESS,
                "rapidfire.knobs": json.dumps(["learning_rate", "peft_config"]),
                RANKING_TAG: RANKING.to_text()}
        if status_of(i) == "stopped":
            tags["rapidfire.op.result"] = (
                f"ok: stopped at step 30 by SuccessiveHalving rung 1: eval_loss "
                f"{eval_loss_of(i):.4g} not in best 1/2 of the 64 runs at this rung (the cut: "
                "1.5); its state is kept: resume it to train it on")
        tracker.ensure_run(f"run-{i}", params, tags)
        if i % 32 != 31:
            points = [("loss", 3.0 - i / 200 - s / 100, s, now + s) for s in range(1, 31)]
            points.append(("eval_loss", eval_loss_of(i), 30, now + 30))
            tracker.log_metrics(f"run-{i}", points)
    tracker.experiment_started()
    tracker.flush(timeout=600)
    return uri, tracker


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("panel-128")
    uri, tracker = write_sweep(folder)
    try:
        with mlflow_server(folder / "mlflow.db", app_name="trl-rapidfire") as url:
            yield url, uri, tracker
    finally:
        tracker.close(parent_status=None)


def _js(driver, script, *args):
    return driver.execute_script(script, *args)


def _wait(driver, condition, what, timeout=60.0):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def probe(d):
        try:
            return condition(d)
        except StaleElementReferenceException:
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(probe)
    except Exception as err:
        raise AssertionError(f"timed out waiting for {what}") from err


def _viewport(driver, width: int, height: int) -> None:
    """The window sized so that the page gets ``width`` x ``height`` (a screen of that size;
    the browser's own bars come on top)."""
    outer = _js(driver, "return [window.outerWidth - window.innerWidth,"
                        " window.outerHeight - window.innerHeight]")
    driver.set_window_size(width + outer[0], height + outer[1])
    assert _js(driver, "return [window.innerWidth, window.innerHeight]") == [width, height]


def _open(driver, url):
    driver.get(f"{url}/rapidfire/")
    _wait(driver, lambda d: _js(d, "return document.querySelectorAll('#rows tr').length")
          == RUNS, "the 128 runs")


def _order(driver) -> list[str]:
    return _js(driver, "return [...document.querySelectorAll('#rows tr:not([hidden])')]"
                       ".map((r) => r.dataset.run)")


def _best_first(values: dict[int, float | None], greater: bool = False) -> list[str]:
    scored = sorted((i for i in values if values[i] is not None),
                    key=lambda i: (-values[i] if greater else values[i], i))
    return [f"run-{i}" for i in scored] + [f"run-{i}" for i in values if values[i] is None]


def test_128_runs_fit_1280x800_best_first_a_line_a_run(sweep):
    url, _uri, _tracker = sweep
    with chromium(1280, 800) as driver:
        _viewport(driver, 1280, 800)
        _open(driver, url)
        want = _best_first({i: eval_loss_of(i) for i in range(RUNS)})
        assert _order(driver) == want
        heads = _js(driver, "return [...document.querySelectorAll('#head th')]"
                            ".map((t) => t.textContent)")
        assert "eval_loss ▲" in heads, heads  # sorted by it, lower first
        assert _js(driver, "return document.getElementById('metric').value") == "eval_loss"
        # One line a row: every row as high as a row of one line of text.
        heights = _js(driver, "return [...document.querySelectorAll('#rows tr')]"
                              ".map((r) => r.getBoundingClientRect().height)")
        line = _js(driver, "return parseFloat(getComputedStyle(document.querySelector("
                           "'#rows td.c-status')).lineHeight)")
        assert max(heights) < 1.8 * line + 8, (max(heights), line)
        # The long policy answer is cut on its line and whole in its tooltip.
        cell = "td[data-answer='run-2']"
        title = _js(driver, "return document.querySelector(arguments[0]).title", cell)
        assert title.endswith("resume it to train it on")
        # The buttons in one row, none cut.
        tops = _js(driver, "return [...document.querySelectorAll(\"tr[data-run='run-2'] "
                           "button\")].map((b) => Math.round(b.getBoundingClientRect().top))")
        assert len(tops) == 4 and len(set(tops)) == 1, tops
        cut = _js(driver, """
            return [...document.querySelectorAll('#rows button')].filter((b) => {
              const r = b.getBoundingClientRect(), c = b.closest('td').getBoundingClientRect();
              return b.scrollWidth > b.clientWidth || r.right > c.right + 0.5 || r.left < c.left;
            }).map((b) => b.getAttribute('aria-label'));""")
        assert cut == []
        # 20 and more rows in sight at once: the table's box scrolled into the window.
        _js(driver, "document.getElementById('table-box').scrollIntoView()")
        seen = _js(driver, """
            const box = document.getElementById('table-box').getBoundingClientRect();
            const head = document.getElementById('head').getBoundingClientRect();
            return [...document.querySelectorAll('#rows tr')].filter((r) => {
              const b = r.getBoundingClientRect();
              return b.top >= head.bottom - 1 && b.bottom <= Math.min(box.bottom,
                window.innerHeight) + 1;
            }).length;""")
        assert seen >= 20, seen
        # No sideways scroll, of the page or of the table.
        assert _js(driver, "return document.scrollingElement.scrollWidth <= window.innerWidth")
        assert _js(driver, "const b = document.getElementById('table-box');"
                           " return b.scrollWidth <= b.clientWidth")
        if os.environ.get("RF_SAVE_SCREENSHOT"):
            _js(driver, "window.scrollTo(0, 0)")
            IMG.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(IMG / "control_panel_128.png"))


def test_headers_sort_and_the_selector_ranks_by_another_metric(sweep):
    url, _uri, _tracker = sweep
    with chromium(1280, 800) as driver:
        _open(driver, url)
        driver.find_element("css selector", "#head th[data-column='run']").click()
        _wait(driver, lambda d: _order(d)[:3] == ["run-0", "run-1", "run-2"], "run order")
        driver.find_element("css selector", "#head th[data-column='run']").click()
        _wait(driver, lambda d: _order(d)[0] == "run-127", "run order reversed")
        lr = "#head th[data-column='knob:learning_rate']"
        driver.find_element("css selector", lr).click()
        _wait(driver, lambda d: _order(d)[:4] == ["run-0", "run-1", "run-2", "run-3"],
              "learning rate, low first")
        # The selector: the training loss (lower is better), for the table and the colours.
        from selenium.webdriver.support.ui import Select

        Select(driver.find_element("id", "metric")).select_by_value("loss")
        losses = {i: None if i % 32 == 31 else 3.0 - i / 200 - 0.3 for i in range(RUNS)}
        _wait(driver, lambda d: _order(d) == _best_first(losses), "best first by loss")
        coloured = _js(driver, "return [...document.querySelectorAll('path.curve.coloured')]"
                               ".map((p) => p.dataset.run)")
        assert sorted(coloured) == sorted(_best_first(losses)[:10])
        assert _js(driver, "return document.getElementById('rank-name').textContent") == "loss"


def test_the_why_view_takes_r_and_alpha_as_one_knob(sweep):
    url, _uri, _tracker = sweep
    with chromium(1280, 800) as driver:
        _open(driver, url)
        driver.find_element("css selector", "#why-view summary").click()
        _wait(driver, lambda d: _js(d, "return document.querySelectorAll('#parallel "
                                       "polyline.parallel-line').length") == RUNS,
              "a line per run", timeout=90)
        knobs = _js(driver, "return [...document.querySelectorAll('#importance tbody "
                            "td.field-name')].map((t) => t.textContent)")
        assert set(knobs) == {"learning_rate", "peft_config.r + lora_alpha"}, knobs
        note = driver.find_element("id", "why-note").text
        assert "eval_loss (lower is better)" in note, note


def test_delete_asks_first_and_the_mlflow_view_is_sorted_by_the_metric(sweep):
    from mlflow import MlflowClient

    url, uri, _tracker = sweep
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "sweep"]
    with chromium(1280, 800) as driver:
        _open(driver, url)
        # The page set the saved view "Open in MLflow" opens, sorted by the metric.
        view = _wait(driver, lambda _: client.get_experiment(exp.experiment_id).tags.get(
            "mlflow.sharedViewState.trl-rapidfire"), "the saved view")
        state = json.loads(json.loads(view)["state"])
        assert state["orderByKey"] == "metrics.`eval_loss`" and state["orderByAsc"] is True
        assert state["columnOrder"][:2] == ["params.`learning_rate`", "params.`peft_config.r`"]
        link = driver.find_element("id", "mlflow-link").get_attribute("href")
        assert f"/experiments/{exp.experiment_id}/runs?" in link and "viewStateShareKey" in link
        run_id = _js(driver, "return window.rfPanel.runs.find((r) => r.name === 'run-5').id")

        def delete(accept: bool) -> None:
            button = driver.find_element("css selector",
                                         "button[data-run='run-5'][data-op='delete']")
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
            button.click()
            alert = _wait(driver, lambda d: d.switch_to.alert, "the confirmation")
            assert "run-5" in alert.text and "cannot be resumed" in alert.text
            alert.accept() if accept else alert.dismiss()

        delete(accept=False)
        time.sleep(2)
        assert "rapidfire.op" not in client.get_run(run_id).data.tags
        delete(accept=True)
        assert _wait(driver, lambda _: client.get_run(run_id).data.tags.get("rapidfire.op"),
                     "the op tag") == "delete"


def test_at_1920_the_progress_column_is_not_cut(sweep):
    url, _uri, _tracker = sweep
    with chromium(1920, 1000) as driver:
        _open(driver, url)
        cut = _js(driver, "return [...document.querySelectorAll('#rows td.c-progress')]"
                          ".filter((c) => c.scrollWidth > c.clientWidth).length")
        assert cut == 0
        widths = _js(driver, "return Object.fromEntries([...document.querySelectorAll("
                             "'#head th')].map((t) => [t.textContent, "
                             "t.getBoundingClientRect().width]))")
        knob = next(w for h, w in widths.items() if h.startswith("peft_config.r"))
        assert knob < 150, widths
