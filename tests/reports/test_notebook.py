"""A real Jupyter kernel without ipywidgets (no ``notebook`` extra; with it, ``train()`` shows
the control panel instead: tests/reports/test_notebook_panel.py) runs the notebook way of
working: ``train(blocking=False)``, a stop through the Python API while it trains, then
``wait()``; the runs table is one output that refreshes in place (nbclient applies the
kernel's display updates to the output with the same display id, as Jupyter's front ends do).

All three are in one cell: nbclient keeps only the outputs of the cell executing when they
arrive, and the training thread's first table may come between two cells (a front end shows it
in the cell that started the thread; nbclient drops it, seen once in CI)."""

from __future__ import annotations

import json

import pytest
from kernel_cells import setup_cell

from trl_rapidfire.testing import tiny_model_path

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

SETUP = setup_cell("{out}", rows=96, chunks=4,
                   before='sys.modules["ipywidgets"] = None  # as without the notebook '
                          "extra: it cannot be imported\n",
                   extra=", disable_tqdm=False") + "trainer.train(blocking=False)\n"
STOP = """\
import time
while trainer.training and not trainer.schedule:  # its first chunk is done
    time.sleep(0.01)
trainer.stop("run-2")
"""
WAIT = """\
trainer.wait()
print({r.name: r.status.value for r in trainer.runs})
"""


@pytest.mark.slow
def test_a_notebook_trains_in_the_background_and_its_runs_table_refreshes_in_place(tmp_path):
    tiny_model_path()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP.replace("{out}", str(tmp_path / "exp"))
                                          + STOP + WAIT)]
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells for o in cell.outputs]
    stdout = "".join(o.get("text", "") for o in nb.cells[0].outputs
                     if o.output_type == "stream" and o.name == "stdout")
    statuses = json.loads(stdout.strip().splitlines()[-1].replace("'", '"'))
    assert statuses == {"run-0": "completed", "run-1": "completed", "run-2": "stopped"}
    tables = [o for o in outputs if o.output_type == "display_data"
              and "knobs" in o.data.get("text/plain", "")]
    # One output for the table, updated at every boundary (not one table per boundary) ...
    assert len(tables) == 1, [t.data["text/plain"] for t in tables]
    text = tables[0].data["text/plain"]
    assert tables[0].data["text/html"].startswith("<pre>")
    # ... showing the end: every run with its final status.
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("run-")}
    assert set(rows) == {"run-0", "run-1", "run-2"}
    assert "completed" in rows["run-0"] and "completed" in rows["run-1"]
    assert "stopped" in rows["run-2"]
    # The bar is tqdm's text one (its widget bar would fail: "IProgress not found", as the bars
    # of transformers' loading steps say here), and one line says what the extra would add.
    stderr = "".join(o.get("text", "") for o in outputs
                     if o.output_type == "stream" and o.name == "stderr")
    assert "chunk/s]" in stderr
    assert 'needs ipywidgets: pip install ipywidgets' in stdout
