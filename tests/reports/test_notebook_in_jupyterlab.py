"""The notebook panel as a person sees and uses it: a real JupyterLab server, a real notebook
run in headless Chromium, the panel drawn by JupyterLab's widget manager, and a real mouse
click on run-1's Stop button (not the widget's Python API, as the kernel test does).

``train(blocking=False)`` shows the panel in its cell; a callback holds run-1 inside its
second chunk until the test has clicked, so the stop lands at that chunk's end however fast
the machine is. The test then reads the answer in the page, the ops the experiment wrote
(``ops.csv``), and with ``RF_SAVE_SCREENSHOT=1`` keeps the page as
``docs/img/notebook_panel.png`` (the README's and the docs' picture).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import chromium
from mlflow_server import free_port

from trl_rapidfire.testing import tiny_model_path

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "notebook_panel.png"

CELL = """\
import os, pathlib, time
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
from transformers import TrainerCallback
from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset, tiny_lora_config,
                                   tiny_model_path)

class HoldRun1(TrainerCallback):
    # Keeps run-1 inside its second chunk until the test clicked its Stop button.
    def __deepcopy__(self, memo):  # every run's trainer gets a copy: share this one
        return self
    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate == 3e-3 and state.global_step == 3:
            pathlib.Path({reached!r}).touch()
            deadline = time.monotonic() + 300
            while not os.path.exists({release!r}) and time.monotonic() < deadline:
                time.sleep(0.05)

config = RFSFTConfig(output_dir={out!r}, learning_rate=List([1e-3, 3e-3, 1e-2]),
                     num_chunks=4, max_steps=8, per_device_train_batch_size=4,
                     logging_steps=1, **dict(cpu_training_kwargs(), disable_tqdm=False))
trainer = RFSFTTrainer(model=tiny_model_path(), args=config,
                       train_dataset=make_sft_dataset(64, seed=1),
                       peft_config=tiny_lora_config(r=4), callbacks=[HoldRun1()])
trainer.train(blocking=False)
"""


@contextlib.contextmanager
def jupyterlab(root: Path) -> Iterator[str]:
    """A JupyterLab server on 127.0.0.1 serving ``root``, with its own config, data and
    settings folders (nothing of the user's is read or written); yields the lab's URL."""
    home = root / ".jupyter-home"
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # No "receive Jupyter news?" toast over the panel.
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), HF_HUB_OFFLINE="1")
    port, token = free_port(), "rf-test"
    log = open(root / "jupyterlab.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.expose_app_in_browser=True",
         *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI's container runs as root
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("jupyterlab did not start:\n"
                                + (root / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield f"{url}/lab/tree/panel.ipynb?token={token}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _wait(driver, condition, what: str, timeout: float, debug: Path):
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def probe(d):
        try:
            return condition(d)
        except WebDriverException:  # a node redrawn under us: look again
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(probe)
    except Exception:
        driver.save_screenshot(str(debug / "failed.png"))
        (debug / "failed.html").write_text(driver.page_source)
        raise AssertionError(f"timed out waiting for {what} (page in {debug})") from None


def _button(driver, title: str):
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f'.jp-OutputArea button[title="{title}"]')
    return found[0] if found else None


def _panel_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return "\n".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, ".jp-OutputArea"))


def _rows(driver) -> dict[str, dict]:
    """Each run's row as the page draws it: its cells' texts, and whether its Stop button sits
    level with them (the same line of the page)."""
    return {row["run"]: row for row in driver.execute_script("""
        return Array.from(document.querySelectorAll(
            '.jp-OutputArea button[title^="stop run-"]')).map((button) => {
          const cells = button.parentElement.firstElementChild;
          const a = button.getBoundingClientRect(), b = cells.getBoundingClientRect();
          return {run: button.title.slice(5),
                  cells: Array.from(cells.children).map((c) => c.innerText.trim()),
                  level: Math.abs((a.top + a.bottom) / 2 - (b.top + b.bottom) / 2) < a.height};
        });""")}


@pytest.mark.slow
def test_in_jupyterlab_the_panel_shows_and_a_click_on_stop_stops_the_run(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    tiny_model_path()
    out, reached, release = tmp_path / "exp", tmp_path / "reached", tmp_path / "release"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(
        CELL.format(out=str(out), reached=str(reached), release=str(release)))]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, tmp_path / "panel.ipynb")
    with jupyterlab(tmp_path) as url, chromium(1200, 880) as driver:
        driver.get(url)
        _wait(driver, lambda d: d.execute_script(
            "const app = window.jupyterapp; const w = app && app.shell.currentWidget;"
            "return !!(w && w.sessionContext && w.sessionContext.session &&"
            " w.sessionContext.session.kernel &&"
            " w.sessionContext.session.kernel.connectionStatus === 'connected')"),
            "the notebook's kernel", 120, tmp_path)
        driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        _wait(driver, lambda d: reached.exists() and _button(d, "stop run-1") is not None,
              "the panel, with run-1 held in its second chunk", 240, tmp_path)
        # A person's click, through the page. The panel redraws its table while it trains:
        # a button found just before a redraw is stale (no click reaches the page), so it is
        # found again and clicked, once.
        _wait(driver, lambda d: (button := _button(d, "stop run-1")) is not None
              and button.click() is None, "a click on Stop", 30, tmp_path)
        _wait(driver, lambda d: "stop: queued" in _panel_text(d), "the queued answer", 30,
              tmp_path)
        release.touch()
        _wait(driver, lambda d: "not training" in _panel_text(d)
              and "stop: ok: stopped at step" in _panel_text(d),
              "the end of training, with run-1's answer", 240, tmp_path)
        text = _panel_text(driver)
        rows = _rows(driver)
        if os.environ.get("RF_SAVE_SCREENSHOT"):
            # The picture: the notebook without the file browser and the cell's code, the
            # panel scrolled into view.
            driver.execute_script(
                "const app = window.jupyterapp; app.shell.collapseLeft();"
                "app.commands.execute('notebook:hide-all-cell-code');")
            time.sleep(1)  # the loss plot's last image, the layout settled
            driver.execute_script(
                "document.querySelector('.jp-OutputArea .widget-vbox').scrollIntoView()")
            time.sleep(0.5)
            driver.save_screenshot(str(tmp_path / "panel.png"))
            shutil.copy(tmp_path / "panel.png", SCREENSHOT)

    # What the page showed: every run, run-1 stopped by the click, the others completed;
    # each run's buttons on its own row, level with its cells.
    assert {name: row["cells"][:2] for name, row in rows.items()} == {
        "run-0": ["run-0", "completed"], "run-1": ["run-1", "stopped"],
        "run-2": ["run-2", "completed"]}, rows
    assert all(row["level"] for row in rows.values()), rows
    # TRL's finished preprocessing bars are collapsed above the panel (one button shows them).
    assert "train dataset" not in text and "preprocessing bars" in text, text
    # What the experiment wrote: the stop, from Python (the panel's button), applied.
    with open(out / "ops.csv", newline="") as f:
        ops = [(r["source"], r["run"], r["op"], r["result"]) for r in csv.DictReader(f)]
    assert [op[:3] for op in ops] == [("python", "run-1", "stop")], ops
    assert ops[0][3].startswith("ok: stopped at step")
