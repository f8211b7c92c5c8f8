"""The notebook panel's buttons show a click until it is answered, Delete asks to be confirmed,
and the panel is laid out to fit (trl_rapidfire/reports/notebook_buttons.py, notebook_rows.py,
notebook_panel.py), driven through the widgets' own API against a trainer that only implements
the panel's PanelTrainer. A front end's press is the button's ``value`` set to ``True`` (what
a click on a toggle button sends); the real kernel and JupyterLab tests are
test_notebook_clicks.py and test_notebook_fits_jupyterlab.py."""

from __future__ import annotations

import pytest

from trl_rapidfire.control.ops import OpRecord
from trl_rapidfire.shared_state.runs import RunStatus

pytest.importorskip("ipywidgets")

from tests.reports.test_notebook_panel import FakeTrainer  # noqa: E402 - after the skip


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def made():
    from trl_rapidfire.reports.notebook_panel import NotebookPanel

    trainer = FakeTrainer()
    panel = NotebookPanel(trainer, poll=False)
    yield panel, trainer
    panel.close()


def test_a_pressed_button_stays_pressed_until_its_op_is_answered(made):
    panel, trainer = made
    row = panel.rows["run-1"]
    row.stop.value = True  # a person's click, as the front end sends it
    assert trainer.asked == [("stop", "run-1")]
    assert row.stop.value is True and "stop: queued" in row.answer.value
    assert "chunk boundary" in row.answer.tooltip
    row.stop.value = False  # pressed again by the person: the op stays queued, so does the button
    assert row.stop.value is True and trainer.asked == [("stop", "run-1")]
    panel.refresh()  # no answer yet: still pending
    assert row.stop.value is True
    trainer.op_log.append(OpRecord.now("python", "run-1", "stop", "ok: stopped at step 4"))
    trainer.runs[1].status = RunStatus.STOPPED
    panel.refresh()
    assert row.stop.value is False and row.stop.disabled
    assert row.answer.value.startswith("stop: ok: stopped at step 4")
    assert row.answer.tooltip == "stop: ok: stopped at step 4"


def test_while_nothing_trains_a_click_stays_pending_for_the_next_train(made):
    panel, trainer = made
    trainer.training = False
    trainer.runs[0].status = RunStatus.STOPPED
    panel.refresh()
    row = panel.rows["run-0"]
    row.resume.click()
    assert trainer.asked == [("resume", "run-0")] and row.resume.value is True
    assert "resume: queued for the next train()" in row.answer.value
    assert "when train() runs again" in row.answer.tooltip


def test_a_refused_click_lets_its_button_go_with_the_reason(made):
    panel, trainer = made

    def refuse(run):
        raise ValueError(f"{run} cannot be stopped now")

    trainer.stop = refuse
    row = panel.rows["run-0"]
    row.stop.value = True
    assert row.stop.value is False and "run-0 cannot be stopped now" in row.answer.value
    assert row.answer.tooltip == "stop: run-0 cannot be stopped now"


def test_delete_asks_to_be_confirmed_and_a_double_click_does_not_confirm(made):
    from trl_rapidfire.reports.notebook_buttons import CONFIRM_SECONDS, DeleteConfirmation

    panel, trainer = made
    clock = Clock()
    panel.table.confirm = DeleteConfirmation(clock)
    row = panel.rows["run-1"]
    row.delete.value = True
    assert trainer.asked == []  # nothing deleted by the first click
    assert row.delete.description == "Confirm" and row.delete.button_style == "danger"
    assert row.delete.value is False and "click Confirm" in row.answer.value
    row.delete.value = True  # the second click of a double click, read at the same moment
    assert trainer.asked == [] and row.delete.description == "Confirm"
    clock.now += 2
    row.delete.value = True  # a click on Confirm, after it was shown
    assert trainer.asked == [("delete", "run-1")]
    assert row.delete.description == "Delete" and row.delete.value is True  # pending
    assert "delete: queued" in row.answer.value
    # Another button in the row, or the time running out, takes the confirmation back.
    other = panel.rows["run-0"]
    other.delete.click()
    assert other.delete.description == "Confirm"
    other.stop.click()
    assert other.delete.description == "Delete" and trainer.asked[-1] == ("stop", "run-0")
    other.delete.click()
    clock.now += CONFIRM_SECONDS + 1
    panel.refresh()
    assert other.delete.description == "Delete" and "click Confirm" not in other.answer.value
    assert "stop: queued" in other.answer.value  # what the row said before, back
    other.delete.click()  # a first click again, not a confirmation
    assert trainer.asked[-1] == ("stop", "run-0") and other.delete.description == "Confirm"


def test_the_curves_come_first_and_each_row_is_one_line_lined_up_with_the_header(made):
    panel, trainer = made
    w = panel.widget.children
    assert w[1] is panel.plot and w[2] is panel.table.widget and w[3] is panel.form.widget
    table = panel.table
    # The header is laid out as a row: its cells' box, the buttons' place, the answer's.
    head = table._body.children[0]
    assert head.children[0] is table._header
    row = panel.rows["run-0"]
    assert row.widget.layout.flex_flow == "row nowrap"
    assert [c.layout.flex for c in row.cells.children] == [
        c.layout.flex for c in table._header.children]
    buttons = sum(int(b.layout.width.removesuffix("px")) + 4
                  for b in (row.stop, row.resume, row.delete, row.clone))
    assert head.children[1].layout.width == f"{buttons}px"
    assert head.children[2].layout.flex == row.answer.layout.flex
    assert head.children[2].layout.min_width == row.answer.layout.min_width
    # A knob's column gives way where the row is too wide; its text is then cut by the page
    # and whole in its tooltip.
    assert float(row.cells.children[5].layout.flex.split()[1]) > 0
    assert row.cells.children[0].layout.flex == "0 0 auto"  # the run's name never does
    assert 'title="0.001"' in row.cells.children[5].value
    # The rows scroll in a box of their own.
    assert table._body.layout.overflow == "auto" and table._body.layout.max_height


def test_a_new_knob_column_redraws_every_row_in_the_new_columns(made):
    from trl_rapidfire.reports.results import RunResult

    panel, trainer = made
    before = list(panel.rows["run-0"].cells.children)
    trainer.runs.append(RunResult("run-2", {"learning_rate": 1e-3, "max_steps": 16},
                                  RunStatus.PENDING, 0, "out/run-2", {}))
    panel.refresh()
    table = panel.table
    assert "max_steps" in table.headers
    for row in panel.rows.values():
        assert [c.layout for c in row.cells.children] == [
            c.layout for c in table._header.children]
    assert all(cell.comm is None for cell in before)  # the old cells are closed
    assert panel.rows["run-2"].texts[table.headers.index("max_steps")] == "16"
