"""Ctrl-C in a notebook: a real Jupyter kernel trains an experiment in a blocking
``train()`` and is interrupted (the kernel's interrupt: SIGINT, as the toolbar's button and
``I I`` send it). The cell ends with one line saying what was kept and that ``train()``
continues (no traceback through the library); the views say the runs in the rotation are
interrupted; the next ``train()`` in the same kernel finishes every run, each chunk trained
once."""

from __future__ import annotations

import json
import queue
import time

import pytest
from kernel_cells import setup_cell

from trl_rapidfire.storage.schedule import read_schedule_csv
from trl_rapidfire.testing import tiny_model_path

pytest.importorskip("ipykernel")
jupyter_client = pytest.importorskip("jupyter_client.manager")

SHOWN = ("print(json.dumps([shown_status(r.status, training=trainer.training) "
         "for r in trainer.runs]))")


def _run_cell(client, code, *, until=None, interrupt=None, timeout=300.0):
    """Execute ``code``; when ``until()`` holds, ``interrupt()``. Returns the cell's stdout
    and its error message (``None`` if it raised nothing)."""
    msg_id = client.execute(code)
    stdout, error, sent = [], None, False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if until is not None and not sent and until():
            interrupt()
            sent = True
        try:
            msg = client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            stdout.append(content["text"])
        elif kind == "error":
            error = content
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(stdout), error
    raise AssertionError(f"the cell did not end within {timeout} s: {code[:80]!r}")


@pytest.mark.slow
def test_a_kernel_interrupt_stops_at_a_boundary_says_one_line_and_train_continues(tmp_path):
    tiny_model_path()
    out = tmp_path / "exp"
    manager, client = jupyter_client.start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        setup = setup_cell(str(out), rows=1000, chunks=8) + (
            "from trl_rapidfire.shared_state.runs import shown_status\n")
        _, error = _run_cell(client, setup)
        assert error is None, error
        # Interrupted once a chunk is done (training has begun; many chunks remain).
        said, error = _run_cell(client, "trainer.train()",
                                until=lambda: (out / "schedule.csv").is_file(),
                                interrupt=manager.interrupt_kernel)
        assert "stopping at the next chunk boundary" in said and "call train() again" in said
        assert error is not None and error["ename"] == "KeyboardInterrupt", error
        # One line, not the frames of the library it passed through.
        assert len(error["traceback"]) == 1, error["traceback"]
        assert error["traceback"][0].startswith("trl-rapidfire: stopped at a chunk boundary")
        assert "call train() again to continue" in error["traceback"][0]
        before = read_schedule_csv(out / "schedule.csv")
        assert 0 < len(before) < 3 * 8

        shown, error = _run_cell(client, SHOWN)
        assert error is None, error
        shown = json.loads(shown)
        assert "interrupted" in shown and "running" not in shown, shown

        said, error = _run_cell(client, "trainer.train()\n" + SHOWN)
        assert error is None, error
        assert json.loads(said.strip().splitlines()[-1]) == ["completed"] * 3
        rows = read_schedule_csv(out / "schedule.csv")
        chunks = [(r.run, r.number) for r in rows]
        assert sorted(chunks) == sorted(set(chunks)) and len(chunks) == 3 * 8
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
