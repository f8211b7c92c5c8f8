"""The notebook panel's runs table, filters, clone form fields, curves and collapsed
preprocessing bars (trl_rapidfire/reports/notebook_rows.py, notebook_form.py,
notebook_curves.py, notebook_bars.py), driven through the widgets' own API against a trainer
that only implements the panel's PanelTrainer; the real kernel and JupyterLab tests are in
test_notebook_panel.py and test_notebook_in_jupyterlab.py."""

from __future__ import annotations

import pytest

from trl_rapidfire.reports.results import RunResult
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import tiny_lora_config

pytest.importorskip("ipywidgets")

from tests.reports.test_notebook_panel import FakeTrainer  # noqa: E402 - after the skip


class LoraTrainer(FakeTrainer):
    """Three runs whose knobs are a learning rate and a LoRA config differing in alpha."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = [RunResult(f"run-{i}", {"learning_rate": lr, "max_steps": 8,
                                            "peft_config": tiny_lora_config(r=8, lora_alpha=a)},
                               status, 4, f"out/run-{i}", {"loss": loss})
                     for i, (lr, a, status, loss) in enumerate([
                         (1e-3, 16, RunStatus.RUNNING, 2.0), (3e-3, 32, RunStatus.RUNNING, 1.5),
                         (3e-3, 64, RunStatus.STOPPED, 1.8)])]

    def metric_history(self, run, key="loss"):
        found = next(r for r in self.runs if r.name == run)
        return [(1, 2.5), (found.global_step, found.metrics[key])]


@pytest.fixture
def panel():
    from trl_rapidfire.reports.notebook_panel import NotebookPanel

    made = NotebookPanel(LoraTrainer(), poll=False)
    yield made
    made.close()


def test_each_row_holds_its_cells_and_buttons_and_a_lora_config_by_the_field_that_differs(
        panel):
    table = panel.table
    assert table.headers == ["run", "status", "steps", "loss", "eval_loss", "learning_rate",
                             "peft_config.lora_alpha", "last op"]
    assert {name: row.texts[5:7] for name, row in panel.rows.items()} == {
        "run-0": ["0.001", "16"], "run-1": ["0.003", "32"], "run-2": ["0.003", "64"]}
    for name, row in panel.rows.items():
        # One HBox per run: its cells, then its own buttons and answer line.
        assert row.widget.children == (row.cells, row.stop, row.resume, row.delete, row.clone,
                                       row.answer)
        assert row.stop.tooltip == f"stop {name}"
    # The columns line up: a column is as wide in every row and in the header.
    widths = [[cell.layout.width for cell in row.cells.children] for row in panel.rows.values()]
    header = [cell.layout.width for cell in table._header.children[:len(table.headers)]]
    assert widths == [header] * 3
    # A row's button acts on its run; the stopped run's Stop is disabled, its Resume is not.
    panel.rows["run-2"].resume.click()
    assert panel._trainer.asked == [("resume", "run-2")]
    assert panel.rows["run-2"].stop.disabled and not panel.rows["run-1"].stop.disabled


def test_filters_by_text_and_status_narrow_the_rows_and_the_curves(panel):
    table = panel.table
    first = panel.plot.value
    assert table.shown == ["run-1", "run-2", "run-0"]  # best first (by loss: none evaluated)
    table.filter.value = "0.003"  # every word in a run's name or knob values
    assert table.shown == ["run-1", "run-2"]
    assert panel.rows["run-0"].widget.layout.display == "none"
    assert panel.plot.value != first  # redrawn with the runs shown
    table.filter.value = "0.003 lora_alpha=64"
    assert table.shown == ["run-2"] and table.count.value == "1 of 3 runs shown"
    table.filter.value = ""
    assert set(table.statuses) == {"running", "stopped"}
    table.statuses["running"].value = False
    assert table.shown == ["run-2"]
    assert panel.rows["run-2"].widget.layout.display == ""
    table.statuses["running"].value = True
    assert table.shown == ["run-1", "run-2", "run-0"] and table.count.value == ""


def test_the_clone_form_edits_a_lora_config_field_by_field_and_says_what_warm_keeps(panel):
    form = panel.form
    panel.rows["run-1"].clone.click()  # the row's Clone: the form, set to clone that run
    assert form.source.value == "run-1"
    assert {n: f.value for n, f in form.fields.items()} == {
        "learning_rate": "0.003", "peft_config.lora_alpha": "32", "peft_config.r": "8",
        "peft_config.lora_dropout": "0.0", "peft_config.target_modules": '["q_proj", "v_proj"]'}
    assert "peft_config" not in form.fields  # no free text of a whole config
    form.fields["peft_config.lora_alpha"].value = "64"
    form.warm.value = True
    form.button.click()
    assert panel._trainer.asked == [("clone", "run-1", {"peft_config.lora_alpha": 64}, True)]
    # What warm start keeps and what starts over, said beside it (engine/clones.py).
    said = form.warm_hint.value
    for words in ("trained weights", "optimizer moments", "last finished chunk",
                  "learning-rate schedule", "start over", "from scratch"):
        assert words in said, words


def test_the_curves_colour_the_top_k_by_loss_and_name_them_at_their_ends():
    from matplotlib.colors import to_hex

    from trl_rapidfire.reports.notebook_curves import GREY, loss_figure, top_runs
    from trl_rapidfire.reports.plot_style import run_style

    curves = {f"run-{i}": [(1, 3.0), (4, 2.0 + i / 10)] for i in range(14)}
    curves["run-14"] = [(1, float("nan"))]  # no loss yet: grey, never in the top
    assert top_runs({n: p[-1][1] for n, p in curves.items()}, 3) == ["run-0", "run-1",
                                                                      "run-2"]
    axes = loss_figure(curves, k=4).axes[0]
    colours = [to_hex(line.get_color()) for line in axes.get_lines()]
    assert colours.count(GREY) == 10  # run-4..run-13, thin, drawn first (beneath)
    assert colours[10:] == [run_style(i).color for i in range(4)]
    assert all(line.get_linewidth() < 1 for line in axes.get_lines()[:10])
    assert axes.get_legend() is None
    labels = sorted((t.get_text().strip(), to_hex(t.get_color())) for t in axes.texts)
    assert labels == [(f"run-{i}", run_style(i).color) for i in range(4)]
    heights = sorted(t.get_position()[1] for t in axes.texts)
    assert all(b - a >= 0.049 for a, b in zip(heights, heights[1:]))  # none covers another


def test_finished_preprocessing_bars_are_collapsed_and_can_be_shown(panel):
    from tqdm.notebook import tqdm

    from trl_rapidfire.reports.notebook_bars import finished_preprocessing_bars

    labels = ("Tokenizing train dataset", "Map", "my own loop", "Truncating eval dataset")
    bars = {desc: tqdm(total=2, desc=desc, display=False) for desc in labels}
    for desc, bar in bars.items():
        if desc != "Truncating eval dataset":  # still running: stays in sight
            bar.update(2)
            bar.close()
    found = finished_preprocessing_bars()
    assert {bars["Tokenizing train dataset"].container, bars["Map"].container} <= set(found)
    assert bars["my own loop"].container not in found
    assert bars["Truncating eval dataset"].container not in found
    panel.refresh()
    assert bars["Tokenizing train dataset"].container.layout.display == "none"
    assert bars["my own loop"].container.layout.display != "none"
    assert panel.show_bars.description.startswith("show ")
    panel.show_bars.value = True
    assert bars["Tokenizing train dataset"].container.layout.display != "none"
    bars["Truncating eval dataset"].close()


def test_a_key_value_word_matches_the_knobs_value_not_a_longer_number():
    from trl_rapidfire.reports.notebook_rows import filter_word_matches

    pairs = [("learning_rate", "0.00102"), ("peft_config.r", "16")]
    assert not filter_word_matches("learning_rate=0.001", "run-0", pairs)  # once a substring
    assert filter_word_matches("learning_rate=0.00102", "run-0", pairs)
    assert filter_word_matches("learning_rate=1.02e-3", "run-0", pairs)  # as numbers
    assert filter_word_matches("r=16", "run-0", pairs)  # the field of a knob's object
    assert not filter_word_matches("r=1", "run-0", pairs)
    assert filter_word_matches("0.001", "run-0", pairs)  # a plain word: anywhere in the text
    assert filter_word_matches("run-", "run-0", pairs)
