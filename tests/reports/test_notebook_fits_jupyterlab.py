"""The notebook panel at 1280 px in JupyterLab with its file browser open, on 128 runs (issue
54, item 6): a real JupyterLab server, the notebook run in headless Chromium at 1280x800, a
blocking ``trainer.train()`` of 32 learning rates x 4 LoRA ranks (the issue's shape).

Checked in the page: the live curves are at the top of the panel, above the runs table; every
row is one line, its four buttons level with its cells; the header's columns line up with the
rows'; nothing scrolls sideways (the notebook, the panel, a row's cells). And with real clicks
while ``train()`` blocks the kernel: Delete asks to be confirmed (nothing is deleted by the
first click), Confirm deletes the run at a chunk boundary (the experiment's ``ops.csv``), its
button held down until the answer came. With ``RF_SAVE_SCREENSHOT=1`` the page is kept as
``docs/img/notebook_panel_1280.png``.
"""

from __future__ import annotations

import csv
import os
import shutil
import time
from pathlib import Path

import pytest
from browser import chromium

from trl_rapidfire.testing import tiny_model_path

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")

from tests.reports.test_notebook_in_jupyterlab import _wait, jupyterlab  # noqa: E402

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "notebook_panel_1280.png"
RUNS = 128

CELL = """\
import os
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset, tiny_lora_config,
                                   tiny_model_path)
rates = [round(1e-4 * 1.2 ** i, 8) for i in range(32)]
config = RFSFTConfig(output_dir={out!r}, learning_rate=List(rates), num_chunks=8, max_steps=8,
                     per_device_train_batch_size=4, logging_steps=1,
                     **dict(cpu_training_kwargs(), disable_tqdm=False))
trainer = RFSFTTrainer(model=tiny_model_path(), args=config,
                       train_dataset=make_sft_dataset(32, seed=1),
                       peft_config=List([tiny_lora_config(r=r, lora_alpha=2 * r)
                                         for r in (4, 8, 16, 32)]))
trainer.train()
"""

# The page's layout, measured: the panel's parts, each row's line, the columns, overflow.
MEASURE = """
const out = document.querySelector('.jp-OutputArea-output .widget-vbox');
const img = out.querySelector('img');
const stops = Array.from(out.querySelectorAll('button[title^="stop run-"]'));
const rows = stops.map((b) => b.parentElement);
const head = out.querySelector('.rf-head');
const box = (e) => e.getBoundingClientRect();
const left = (e) => Array.from(e.children).map((c) => Math.round(box(c).left));
const scroller = document.querySelector('.jp-WindowedPanel-outer')
  || document.querySelector('.jp-Notebook');
const browser = document.querySelector('.jp-FileBrowser');
return {
  runs: rows.length,
  browser: browser ? box(browser).width : 0,
  plot: img && img.naturalWidth > 0 ? [box(img).top, box(img).bottom] : null,
  head: box(head).top,
  heights: rows.map((r) => Math.round(box(r).height)),
  level: rows.every((r) => Array.from(r.querySelectorAll('button')).every((b) =>
    Math.abs(box(b).top + box(b).height / 2
             - (box(r.firstElementChild).top + box(r.firstElementChild).height / 2)) < 6)),
  headCells: left(head.firstElementChild),
  rowCells: left(rows[0].firstElementChild),
  sideways: [scroller.scrollWidth - scroller.clientWidth, out.scrollWidth - out.clientWidth,
             Math.max(...rows.map((r) => r.scrollWidth - r.clientWidth)),
             Math.max(...rows.map((r) => r.firstElementChild.scrollWidth
                                         - r.firstElementChild.clientWidth))],
};
"""


def _button(driver, title: str):
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f'.jp-OutputArea button[title^="{title}"]')
    return found[0] if found else None


def _click(driver, title: str, debug: Path):
    """A person's click on the button ``title`` starts with, scrolled to the middle of the
    rows' box first (their header stays on top of the box and would take a click at its top
    edge). The panel redraws its rows while it trains: a button found just before a redraw is
    stale (no click reaches the page), so it is found again. Returns the button clicked."""
    clicked = []

    def click(d) -> bool:
        element = _button(d, title)
        if element is None:
            return False
        d.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
        element.click()
        clicked.append(element)
        return True

    _wait(driver, click, f"a click on {title!r}", 30, debug)
    return clicked[-1]


def _answer(driver, run: str) -> tuple[str, str]:
    """``run``'s answer line (the last child of its row): its text, and the tooltip a person
    hovering its middle sees (the title of the element there, or of the nearest above)."""
    return tuple(driver.execute_script(
        "const row = document.querySelector("
        "`.jp-OutputArea button[title='stop ${arguments[0]}']`).parentElement;"
        "const a = row.lastElementChild, r = a.getBoundingClientRect();"
        "const there = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);"
        "const titled = there && there.closest('[title]');"
        "return [a.innerText.trim(), titled ? titled.title : ''];", run))


def _ops(out: Path) -> list[tuple[str, str, str]]:
    if not (out / "ops.csv").exists():
        return []
    with open(out / "ops.csv", newline="") as f:
        return [(r["run"], r["op"], r["result"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_at_1280_px_with_the_file_browser_open_the_panel_fits_and_delete_is_confirmed(
        tmp_path):
    nbformat = pytest.importorskip("nbformat")
    tiny_model_path()
    out = tmp_path / "exp"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(CELL.format(out=str(out)))]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, tmp_path / "panel.ipynb")
    with jupyterlab(tmp_path) as url, chromium(1280, 800) as driver:
        driver.get(url)
        _wait(driver, lambda d: d.execute_script(
            "const app = window.jupyterapp; const w = app && app.shell.currentWidget;"
            "return !!(w && w.sessionContext && w.sessionContext.session &&"
            " w.sessionContext.session.kernel &&"
            " w.sessionContext.session.kernel.connectionStatus === 'connected')"),
            "the notebook's kernel", 120, tmp_path)
        driver.execute_script("const app = window.jupyterapp; app.shell.expandLeft();"
                              "app.commands.execute('filebrowser:activate');"
                              "app.commands.execute('notebook:run-all-cells')")
        # Training (the kernel busy in train()), with curves drawn.
        measured = _wait(driver, lambda d: (m := d.execute_script(MEASURE))["runs"] == RUNS
                         and m["plot"] and m, "the panel's 128 rows and its curves", 300,
                         tmp_path)
        assert measured["browser"] > 200, measured  # JupyterLab's file browser is open
        # The curves at the top, above the table.
        assert measured["plot"][1] <= measured["head"], measured
        # One line a row (a button's height and its margins), the buttons level with the
        # cells; the header's columns where the rows' are; nothing scrolls sideways.
        assert max(measured["heights"]) <= 32, measured["heights"]
        assert measured["level"]
        assert measured["headCells"] == measured["rowCells"], measured
        assert max(measured["sideways"]) <= 0, measured["sideways"]

        # Delete, clicked while train() blocks the kernel: it asks to be confirmed first.
        _click(driver, "delete run-100", tmp_path)
        _wait(driver, lambda d: d.execute_script(
            "return arguments[0].innerText", _button(d, "delete run-100")) == "Confirm",
            "the Confirm button", 120, tmp_path)
        assert "click Confirm" in _answer(driver, "run-100")[0]
        assert not [op for op in _ops(out) if op[1] == "delete"]
        time.sleep(1)  # a person reads "Confirm" before clicking it (a click as it is drawn
        # is taken for the second half of a double click: notebook_buttons.CONFIRM_GAP)
        confirm = _click(driver, "delete run-100", tmp_path)
        held = driver.execute_script("return arguments[0].classList.contains('mod-active')",
                                     confirm)
        _wait(driver, lambda d: _answer(d, "run-100")[0].startswith("delete: ok"),
              "the delete's answer", 120, tmp_path)
        text, tooltip = _answer(driver, "run-100")
        if os.environ.get("RF_SAVE_SCREENSHOT"):
            # The picture: curves with some length to them, the rows' box at its top.
            _wait(driver, lambda d: len((out / "schedule.csv").read_text().splitlines()) > 400,
                  "400 chunks trained", 300, tmp_path)
            driver.execute_script(
                "document.querySelector('.rf-head').parentElement.scrollTop = 0;"
                "document.querySelector('.jp-OutputArea .widget-vbox').scrollIntoView()")
            time.sleep(1)
            driver.save_screenshot(str(tmp_path / "panel.png"))
            shutil.copy(tmp_path / "panel.png", SCREENSHOT)
        released = not driver.execute_script(
            "return arguments[0].classList.contains('mod-active')",
            _button(driver, "delete run-100"))

    assert held, "Confirm was not drawn pressed at once"
    assert released, "the button was not let go with the answer"
    assert tooltip == text  # the whole answer in its tooltip, the line cut where narrow
    deletes = [op for op in _ops(out) if op[1] == "delete"]
    assert [op[:2] for op in deletes] == [("run-100", "delete")], deletes
    assert deletes[0][2].startswith("ok"), deletes
