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

from trl_rapidfire.testing import tiny_model_path

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

SETUP = """\
import os, sys
sys.modules["ipywidgets"] = None  # as without the notebook extra: it cannot be imported
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset, tiny_lora_config,
                                   tiny_model_path)
config = RFSFTConfig(output_dir={out!r}, learning_rate=List([1e-3, 3e-3, 1e-2]),
                     num_chunks=4, per_device_train_batch_size=4, num_train_epochs=1,
                     **dict(cpu_training_kwargs(), disable_tqdm=False))
trainer = RFSFTTrainer(model=tiny_model_path(), args=config,
                       train_dataset=make_sft_dataset(96, seed=1),
                       peft_config=tiny_lora_config(r=4))
trainer.train(blocking=False)
"""
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
    nb.cells = [nbformat.v4.new_code_cell(SETUP.format(out=str(tmp_path / "exp")) + STOP + WAIT)]
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
    assert 'needs ipywidgets: pip install "trl-rapidfire[notebook]"' in stdout
