"""``trainer.panel()``: the notebook's control panel (trl_rapidfire/reports/notebook_panel.py).

The kernel test runs a real Jupyter kernel: ``train(blocking=False)``, which shows the panel
in its cell (a notebook's progress view), then, in a later cell, the panel refreshing by
itself (its polling thread) while the kernel is idle or runs other code, a click on run-1's
Stop button and on the clone form's Clone button through the widgets' own API
(``button.click()``, what a front end's click does), and ``wait()``. The test in JupyterLab
(test_notebook_in_jupyterlab.py) clicks with Chromium instead. The fast tests drive the same
widgets against a fake trainer that only implements
:class:`~trl_rapidfire.reports.notebook_form.PanelTrainer`.
"""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from trl_rapidfire.control.ops import OpRecord
from trl_rapidfire.reports.results import RunResult
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import tiny_model_path

pytest.importorskip("ipywidgets")

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class FakeTrainer:
    """The panel's view of a trainer (PanelTrainer), recording the ops asked of it."""

    def __init__(self) -> None:
        self.runs = [RunResult(f"run-{i}", {"learning_rate": lr, "max_steps": 8},
                               RunStatus.RUNNING, 4, f"out/run-{i}", {"loss": 2.0 - i})
                     for i, lr in enumerate([1e-3, 3e-3])]
        self.op_log: list[OpRecord] = []
        self.schedule: list[int] = []
        self.training = True
        self.asked: list[tuple] = []
        self.history_reads: list[str] = []

    def metric_history(self, run, key="loss"):
        self.history_reads.append(run)
        found = next(r for r in self.runs if r.name == run)
        return [(step, 2.5) for step in range(1, found.global_step)] + (
            [(found.global_step, found.metrics[key])] if key in found.metrics else [])

    def stop(self, run):
        self.asked.append(("stop", run))

    def resume(self, run):
        self.asked.append(("resume", run))

    def delete(self, run):
        self.asked.append(("delete", run))

    def clone(self, run, overrides=None, *, warm=False):
        self.asked.append(("clone", run, overrides, warm))


def _panel(trainer):
    from trl_rapidfire.reports.notebook_panel import NotebookPanel

    return NotebookPanel(trainer, poll=False)


def test_the_clone_form_sends_the_changed_fields_parsed_and_warm():
    trainer = FakeTrainer()
    panel = _panel(trainer)
    form = panel.form
    form.source.value = "run-1"
    # Pre-filled with run-1's values: the knob that differs (learning_rate); max_steps is
    # every run's, so it is no field.
    assert {name: field.value for name, field in form.fields.items()} == {
        "learning_rate": "0.003"}
    form.fields["learning_rate"].value = "1e-4"
    form.more.value = '{"peft_config.r": 16}'
    form.warm.value = True
    form.button.click()
    assert trainer.asked == [("clone", "run-1", {"learning_rate": 0.0001, "peft_config.r": 16},
                              True)]
    assert isinstance(trainer.asked[0][2]["learning_rate"], float)
    # Its answer, once the experiment gives it, shows in the parent's line.
    trainer.op_log.append(OpRecord.now("python", "run-1", 'clone-warm {"learning_rate": 0.0001}',
                                       "ok: created run-2"))
    panel.refresh()
    assert "ok: created run-2" in panel.rows["run-1"].answer.value
    # Unchanged fields are not sent; text that is not JSON goes as text; "more" must be an object.
    form.fields["learning_rate"].value = "0.003"
    form.more.value = ""
    assert form.overrides() == {}
    form.fields["learning_rate"].value = "cosine"
    assert form.overrides() == {"learning_rate": "cosine"}
    form.more.value = "[1]"
    form.button.click()
    assert "must be a JSON object" in form.answer.value and len(trainer.asked) == 1
    panel.close()


def test_a_stop_button_queues_the_op_and_its_line_shows_the_answer():
    trainer = FakeTrainer()
    panel = _panel(trainer)
    assert panel.refreshes == 1 and panel.rows["run-0"].texts[:2] == ["run-0", "running"]
    # The buttons are on the run's own row, beside its cells.
    row = panel.rows["run-1"]
    assert row.widget.children[:5] == (row.cells, row.stop, row.resume, row.delete, row.clone)
    assert row.resume.disabled and not panel.rows["run-1"].stop.disabled
    panel.rows["run-1"].stop.click()
    assert trainer.asked == [("stop", "run-1")]
    assert "queued" in panel.rows["run-1"].answer.value
    # A policy's op on the same run is not the answer to the button.
    trainer.op_log.append(OpRecord.now("policy:Budget", "run-1", "stop", "skipped: ..."))
    trainer.op_log.append(OpRecord.now("python", "run-1", "stop", "ok: stopped at step 4"))
    trainer.runs[1].status = RunStatus.STOPPED
    panel.refresh()
    assert "stop: ok: stopped at step 4" in panel.rows["run-1"].answer.value
    assert panel.rows["run-1"].stop.disabled and not panel.rows["run-1"].resume.disabled
    panel.close()


def test_without_ipywidgets_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets now fails
    with pytest.raises(ImportError, match=re.escape('pip install ipywidgets')):
        _panel(FakeTrainer())


def test_the_panel_polls_until_training_ended_and_draws_the_end():
    trainer = FakeTrainer()
    from trl_rapidfire.reports.notebook_panel import NotebookPanel

    panel = NotebookPanel(trainer, interval=0.02)
    assert panel.polling
    trainer.schedule.append(1)
    trainer.runs[0].global_step = 8
    trainer.runs[0].status = RunStatus.COMPLETED
    trainer.training = False
    deadline = time.monotonic() + 10
    while panel.polling and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not panel.polling
    assert panel.rows["run-0"].texts[1] == "completed" and "not training" in panel.header.value
    assert bytes(panel.plot.value).startswith(b"\x89PNG")
    panel.close()


def test_the_plot_reads_the_history_of_the_runs_that_moved_only():
    trainer = FakeTrainer()
    panel = _panel(trainer)
    assert sorted(trainer.history_reads) == ["run-0", "run-1"]  # once each
    first = panel.plot.value
    panel.refresh()  # nothing trained since: no history read, the same picture
    assert sorted(trainer.history_reads) == ["run-0", "run-1"] and panel.plot.value == first
    trainer.runs[0].global_step = 6  # run-0 trained a chunk
    trainer.schedule.append(1)
    panel.refresh()
    assert sorted(trainer.history_reads[:2]) == ["run-0", "run-1"]
    assert trainer.history_reads[2:] == ["run-0"]  # only the run that moved, read again
    assert panel.plot.value != first
    panel.close()


SETUP = """\
import os, threading, time
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
from transformers import TrainerCallback
from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset, tiny_lora_config,
                                   tiny_model_path)

class Gate(TrainerCallback):
    # Holds run-1 inside its second chunk until the test clicked Stop: the stop then lands
    # at that chunk's end, however fast the machine.
    def __init__(self):
        self.reached, self.release = threading.Event(), threading.Event()
    def __deepcopy__(self, memo):  # every run's trainer gets a copy: share this one
        return self
    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate == 3e-3 and state.global_step == 3:
            self.reached.set()
            self.release.wait(timeout=300)

gate = Gate()
config = RFSFTConfig(output_dir={out!r}, learning_rate=List([1e-3, 3e-3, 1e-2]), num_chunks=4,
                     max_steps=8, per_device_train_batch_size=4, logging_steps=1,
                     **dict(cpu_training_kwargs(), disable_tqdm=False))
trainer = RFSFTTrainer(model=tiny_model_path(), args=config,
                       train_dataset=make_sft_dataset(64, seed=1),
                       peft_config=tiny_lora_config(r=4), callbacks=[gate])
trainer.train(blocking=False)  # shows the panel in this cell
panel = trainer.panel()  # the same panel, to click its buttons from the next cell
assert panel is trainer.panel()
"""
CLICK = """\
import json, re
assert gate.reached.wait(timeout=300)
deadline = time.monotonic() + 60
def table():
    return {name: row.texts for name, row in panel.rows.items()}
# The polling thread's work, before any click: a run's steps drawn (the gate holds run-1).
while not any(int(texts[2]) > 0 for texts in table().values()):
    assert time.monotonic() < deadline, table()
    time.sleep(0.05)
seen = {"refreshes": panel.refreshes, "table": table()}
panel.rows["run-1"].stop.click()
panel.form.source.value = "run-0"
panel.form.fields["learning_rate"].value = "5e-4"
panel.form.button.click()
gate.release.set()
trainer.wait()
deadline = time.monotonic() + 60
while panel.polling:  # it draws the end, then stops
    assert time.monotonic() < deadline
    time.sleep(0.05)
print(json.dumps(dict(
    seen=seen, refreshes=panel.refreshes, table=table(), header=panel.header.value,
    bars=len(panel.bars), bars_button=panel.show_bars.description,
    answer=panel.rows["run-1"].answer.value, clone_answer=panel.rows["run-0"].answer.value,
    statuses={r.name: r.status.value for r in trainer.runs},
    knobs={r.name: r.knobs.get("learning_rate") for r in trainer.runs},
    ops=[[o.source, o.run, o.op, o.result] for o in trainer.op_log],
    plot=len(panel.plot.value))))
"""


def _front_end_rows(states: dict) -> dict[str, list[str]]:
    """The runs' rows as the front end holds them (the widgets' state, by model id): a row is
    an HBox of its cells' HBox and its buttons; a run's Stop button names its run."""
    def model(ref):
        return states[ref.removeprefix("IPY_MODEL_")]["state"]

    rows = {}
    for entry in states.values():
        children = entry["state"].get("children") or []
        if entry["model_name"] != "HBoxModel" or len(children) != 6:
            continue
        stop = model(children[1])
        if not str(stop.get("tooltip", "")).startswith("stop run-"):
            continue
        cells = [re.sub(r"<[^>]*>", "", model(c)["value"]) for c in model(children[0])["children"]]
        rows[stop["tooltip"].removeprefix("stop ")] = cells
    return rows


def _preprocessing_bars(states: dict) -> list[str]:
    """The display of each finished TRL/datasets preprocessing bar the front end holds."""
    found = []
    for entry in states.values():
        children = entry["state"].get("children") or []
        if entry["model_name"] != "HBoxModel" or len(children) != 3:
            continue
        label, bar = (states[c.removeprefix("IPY_MODEL_")]["state"] for c in children[:2])
        if bar.get("bar_style") == "success" and "dataset" in str(label.get("value", "")):
            layout = states[entry["state"]["layout"].removeprefix("IPY_MODEL_")]["state"]
            found.append(layout.get("display"))
    return found


@pytest.mark.slow
def test_in_a_kernel_the_panel_refreshes_while_training_and_its_stop_button_stops(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    tiny_model_path()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP.format(out=str(tmp_path / "exp"))),
                nbformat.v4.new_code_cell(CLICK)]
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells for o in cell.outputs]
    stdout = "".join(o.get("text", "") for o in nb.cells[1].outputs
                     if o.output_type == "stream" and o.name == "stdout")
    got = json.loads(stdout.strip().splitlines()[-1])

    # Refreshed by itself while training (before any click), showing the runs' steps.
    assert got["seen"]["refreshes"] >= 2
    seen_rows = got["seen"]["table"]
    assert set(seen_rows) == {"run-0", "run-1", "run-2"}
    assert any(int(cells[2]) > 0 for cells in seen_rows.values()), got["seen"]

    # The Stop click stopped run-1 at its chunk's end; the others (and the clone) completed.
    assert got["statuses"] == {"run-0": "completed", "run-1": "stopped", "run-2": "completed",
                               "run-3": "completed"}
    assert got["knobs"]["run-3"] == pytest.approx(5e-4)
    python_ops = [op for op in got["ops"] if op[0] == "python"]
    assert python_ops[0][1:3] == ["run-1", "stop"] and python_ops[0][3].startswith("ok")
    assert python_ops[1][1] == "run-0" and python_ops[1][2].startswith("clone ")
    assert python_ops[1][3].startswith("ok")

    # The panel's end: run-1 stopped with its answer, the clone in the table, a plot.
    rows = got["table"]
    assert rows["run-1"][1] == "stopped" and rows["run-3"][1] == "completed"
    assert got["answer"].startswith("stop: ok: stopped at step")
    assert got["clone_answer"].startswith("clone ") and "ok: created run-3" in got["clone_answer"]
    # Every chunk the experiment trains is trained: run-1's stop took its untrained chunks out
    # of the count (16 planned, 4 runs x 4 chunks, less what run-1 did not train).
    assert "not training" in got["header"]
    counted = re.search(r"<b>(\d+)</b> of (\d+) chunks", got["header"])
    assert counted and counted.group(1) == counted.group(2) and int(counted.group(2)) < 16
    assert got["plot"] > 0

    # What the front end holds (nbclient keeps the widgets' state from the kernel's comm
    # messages): the same final rows, each with its own buttons, drawn by the polling thread
    # after wait() returned.
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert _front_end_rows(states) == rows
    # TRL's finished preprocessing bars (building the runs) are collapsed above the panel,
    # and the panel's button says how many.
    hidden = _preprocessing_bars(states)
    assert hidden and set(hidden) == {"none"}, hidden
    assert got["bars"] >= len(hidden) and got["bars_button"].startswith("show ")

    # train() showed the panel in its cell, as the progress view: one widget view there, and
    # neither tqdm's bar nor the text runs table besides (they would say the same twice).
    # (The other widget views are the bars of transformers' and datasets' loading steps.)
    views = [o for o in outputs if WIDGET_VIEW in o.get("data", {})]
    panels = [o for o in views if o.data["text/plain"].startswith("VBox(")]
    assert [o in nb.cells[0].outputs and o.output_type for o in panels] == ["display_data"]
    assert not [o for o in views if o.data["text/plain"].startswith("chunks")]
    assert not [o for o in outputs if o.output_type == "display_data"
                and "knobs" in o.data.get("text/plain", "")]  # the text runs table
    assert "chunk/s" not in json.dumps(outputs)  # tqdm's text bar
    assert "IProgress not found" not in json.dumps(outputs)
