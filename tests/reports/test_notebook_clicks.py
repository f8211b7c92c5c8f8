"""Clicks on the notebook panel while the kernel is busy training (issue 54, item 1).

A real Jupyter kernel runs a blocking ``trainer.train()``; the test plays the front end: it
reads the kernel's IOPub messages for the panel's widgets (their ``comm_open`` states and every
update after) and clicks a button by sending the ``comm_msg`` a front end sends for it on the
shell channel. A callback holds run-1 inside a chunk (a chunk that takes long, as on a real
model) until the test has clicked, so the click lands mid-chunk however fast the machine is.

Checked: Stop clicked during a blocking ``train()`` stops run-1 at the end of the chunk it was
clicked in (the op log and ``schedule.csv``); the kernel said it was idle after the click (a
front end's next change to the widget waits for that); its row showed the click as pending,
then the answer; a click signed with another key was dropped; cells sent to the kernel
meanwhile still run after it, in their order; Resume clicked while nothing trains stays
pending (its button pressed) until the next ``train()`` applies it; and Stop clicked while
``wait()`` waits for ``train(blocking=False)`` acts within the chunk too (another experiment:
a run stopped by a blocking ``train()`` cannot be resumed by a ``train(blocking=False)`` in
the same process, a limit of the engine's coroutines).
"""

from __future__ import annotations

import csv
import json
import queue
import time
from pathlib import Path

import pytest

from trl_rapidfire.storage.schedule import read_schedule_csv
from trl_rapidfire.testing import tiny_model_path

pytest.importorskip("ipywidgets")
pytest.importorskip("ipykernel")
jupyter_client = pytest.importorskip("jupyter_client.manager")

SETUP = """\
import os, json, pathlib, time
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
from transformers import TrainerCallback
from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset, tiny_lora_config,
                                   tiny_model_path)
HOLD = {{"step": 3}}
order = []

class HoldRun1(TrainerCallback):
    # Keeps run-1 at HOLD's step (inside a chunk) until the test has clicked.
    def __deepcopy__(self, memo):  # every run's trainer gets a copy: share this one
        return self
    def on_step_end(self, args, state, control, **kwargs):
        step = HOLD["step"]
        if step is not None and args.learning_rate == 3e-3 and state.global_step == step:
            pathlib.Path({root!r}, f"reached-{{step}}").touch()
            release = pathlib.Path({root!r}, f"release-{{step}}")
            deadline = time.monotonic() + 300
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

def make(out):
    config = RFSFTConfig(output_dir=out, learning_rate=List([1e-3, 3e-3, 1e-2]),
                         num_chunks=4, max_steps=8, per_device_train_batch_size=4,
                         logging_steps=1, **dict(cpu_training_kwargs(), disable_tqdm=False))
    return RFSFTTrainer(model=tiny_model_path(), args=config,
                        train_dataset=make_sft_dataset(64, seed=1),
                        peft_config=tiny_lora_config(r=4), callbacks=[HoldRun1()])

trainer = make({out!r})
"""
ROW = """\
row = trainer.panel().rows["run-1"]
print(json.dumps({"answer": row.answer.value, "tooltip": row.answer.tooltip,
                  "stop": [row.stop.value, row.stop.disabled],
                  "resume": [row.resume.value, row.resume.disabled],
                  "statuses": {r.name: r.status.value for r in trainer.runs}}))
"""


class FrontEnd:
    """What a front end knows of the kernel's widgets: each model's state, by comm id, kept
    up to date from IOPub, and the history of each model's ``value``; it clicks as a front
    end does."""

    def __init__(self, client) -> None:
        self.client = client
        self.states: dict[str, dict] = {}
        self.values: dict[str, list] = {}
        self.clicks: list[str] = []  # the click messages sent, by id
        self.idle: list[str] = []  # the messages the kernel said it is idle after, in order
        self.cell = ""  # the last cell run's message id

    def read(self, timeout: float = 0.1):
        """One IOPub message (``None`` if none came), folded into the widgets' states."""
        try:
            msg = self.client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return None
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            self.idle.append(msg["parent_header"].get("msg_id"))
        if kind == "comm_open" and "state" in content.get("data", {}):
            self.states[content["comm_id"]] = dict(content["data"]["state"])
            self._noted(content["comm_id"], content["data"]["state"])
        elif kind == "comm_msg" and content.get("data", {}).get("method") in (
                "update", "echo_update"):
            state = content["data"]["state"]
            self.states.setdefault(content["comm_id"], {}).update(state)
            self._noted(content["comm_id"], state)
        return msg

    def _noted(self, model: str, state: dict) -> None:
        if "value" in state:
            self.values.setdefault(model, []).append(state["value"])

    def button(self, tooltip: str, *, besides: frozenset[str] = frozenset()) -> str | None:
        """The comm id of the button whose tooltip is ``tooltip`` (``stop run-1``), other
        than the models in ``besides`` (another panel's)."""
        return next((model for model, state in self.states.items()
                     if state.get("tooltip") == tooltip and model not in besides
                     and state.get("_model_name", "").endswith("ButtonModel")), None)

    def row_answer(self, run: str) -> str | None:
        """The comm id of ``run``'s answer line: the last child of the row holding its Stop."""
        stop = self.button(f"stop {run}")
        for state in self.states.values():
            children = state.get("children") or []
            if f"IPY_MODEL_{stop}" in children:
                return children[-1].removeprefix("IPY_MODEL_")
        return None

    def click(self, model: str) -> None:
        """The message a front end sends when a person clicks the button ``model``: a toggle
        button's new value, or a button's click event."""
        if self.states[model]["_model_name"] == "ToggleButtonModel":
            data = {"method": "update", "state": {"value": True}, "buffer_paths": []}
        else:
            data = {"method": "custom", "content": {"event": "click"}}
        msg = self.client.session.msg("comm_msg", {"comm_id": model, "data": data})
        self.client.shell_channel.send(msg)
        self.clicks.append(msg["header"]["msg_id"])

    def forge(self, model: str) -> None:
        """A click on ``model`` signed with another key than the kernel's (the kernel must
        drop it, and go on)."""
        from jupyter_client.session import Session

        other = Session(key=b"not the kernel's key", username=self.client.session.username)
        data = {"method": "update", "state": {"value": True}, "buffer_paths": []}
        other.send(self.client.shell_channel.socket,
                   other.msg("comm_msg", {"comm_id": model, "data": data}))

    def run(self, code: str, *, during=None, timeout: float = 300.0) -> tuple[str, dict | None]:
        """Execute ``code``; ``during()`` is called between messages until it returns true.
        Returns the cell's stdout and its error (``None`` if none)."""
        msg_id = self.cell = self.client.execute(code)
        stdout, error, done = [], None, during is None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not done:
                done = bool(during())
            msg = self.read()
            if msg is None or msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                stdout.append(content["text"])
            elif kind == "error":
                error = content
            elif kind == "status" and content["execution_state"] == "idle":
                assert done, ("the cell ended before the test could click", stdout, error)
                return "".join(stdout), error
        raise AssertionError(f"the cell did not end within {timeout} s: {code[:80]!r}")

    def run_json(self, code: str) -> dict:
        said, error = self.run(code)
        assert error is None, error
        return json.loads(said.strip().splitlines()[-1])


def _ops(out: Path) -> list[tuple[str, str, str, str]]:
    with open(out / "ops.csv", newline="") as f:
        return [(r["source"], r["run"], r["op"], r["result"]) for r in csv.DictReader(f)]


def _chunks_of(out: Path, run: str) -> int:
    return sum(1 for row in read_schedule_csv(out / "schedule.csv") if row.run == run)


@pytest.mark.slow
def test_a_click_during_a_blocking_train_acts_within_its_chunk_and_shows_pending(tmp_path):
    tiny_model_path()
    out = tmp_path / "exp"
    manager, client = jupyter_client.start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    front = FrontEnd(client)
    try:
        _, error = front.run(SETUP.format(root=str(tmp_path), out=str(out)))
        assert error is None, error

        # A blocking train(): run-1 is held at step 3 (inside its second chunk of two steps)
        # while the test clicks its Stop and sends two more cells; then it goes on.
        later: list[str] = []

        def click_stop_mid_chunk() -> bool:
            stop = front.button("stop run-1")
            if stop is None or not (tmp_path / "reached-3").exists():
                return False
            front.forge(front.button("delete run-0"))  # dropped: training goes on
            front.click(stop)
            later.extend(front.client.execute(f"order.append({i})") for i in (1, 2))
            time.sleep(0.5)  # the messages are in the kernel's queue, then the run goes on
            (tmp_path / "release-3").touch()
            return True

        said, error = front.run("trainer.train()", during=click_stop_mid_chunk)
        assert error is None, (said, error)
        # Stopped at the end of the chunk it was clicked in: step 4, its second chunk.
        assert _ops(out) == [("python", "run-1", "stop", "ok: stopped at step 4")]
        assert _chunks_of(out, "run-1") == 2
        assert {r: _chunks_of(out, r) for r in ("run-0", "run-2")} == {"run-0": 4, "run-2": 4}
        # The kernel said it was idle after the click (a front end sends a widget's next change
        # only then: ipywidgets' message throttle), while the cell still ran.
        assert front.idle.index(front.clicks[0]) < front.idle.index(front.cell), front.idle
        row = front.run_json(ROW)
        # Its row said the click was pending, then the experiment's answer (what the front
        # end was sent).
        answers = front.values[front.row_answer("run-1")]
        pending = [i for i, text in enumerate(answers) if "stop: queued" in text]
        answered = [i for i, text in enumerate(answers)
                    if text.startswith("stop: ok: stopped at step 4")]
        assert pending and answered and pending[0] < answered[0], answers
        assert row["answer"].startswith("stop: ok: stopped at step 4"), row
        assert row["stop"] == [False, True] and row["resume"] == [False, False], row
        # The cells sent while it trained ran after it, in their order.
        assert front.run_json("print(json.dumps(order))") == [1, 2]

        # Resume while nothing trains: pending (its button held down) until train() applies it.
        front.click(front.button("resume run-1"))
        deadline = time.monotonic() + 30
        while "resume" not in (front.states[front.row_answer("run-1")].get("value") or ""):
            assert time.monotonic() < deadline, front.states[front.row_answer("run-1")]
            front.read()
        row = front.run_json(ROW)
        assert "resume: queued for the next train()" in row["answer"], row
        assert row["resume"][0] is True and row["statuses"]["run-1"] == "stopped", row

        said, error = front.run('HOLD["step"] = None\ntrainer.train()')
        assert error is None, (said, error)
        row = front.run_json(ROW)
        ops = _ops(out)
        assert ops[1][:3] == ("python", "run-1", "resume") and ops[1][3].startswith("ok"), ops
        assert row["answer"].startswith("resume: ok"), row
        assert row["resume"][0] is False, row  # let go once answered
        assert set(row["statuses"].values()) == {"completed"}, row

        # train(blocking=False) and wait() (another experiment in the same kernel): its run-1
        # is held at step 3, and a Stop clicked while wait() waits stops it at that chunk's
        # end (step 4).
        first_panel = frozenset(front.states)
        out = tmp_path / "exp2"

        def click_stop_while_waiting() -> bool:
            stop = front.button("stop run-1", besides=first_panel)
            if stop is None or not (tmp_path / "reached-3").exists():
                return False
            front.click(stop)
            time.sleep(0.5)
            (tmp_path / "release-3").touch()
            return True

        for name in ("reached-3", "release-3"):
            (tmp_path / name).unlink()
        said, error = front.run(f'HOLD["step"] = 3\ntrainer = make({str(out)!r})\n'
                                "trainer.train(blocking=False)\ntrainer.wait()",
                                during=click_stop_while_waiting)
        assert error is None, (said, error)
        row = front.run_json(ROW)
        assert _ops(out) == [("python", "run-1", "stop", "ok: stopped at step 4")]
        assert row["statuses"] == {"run-0": "completed", "run-1": "stopped",
                                   "run-2": "completed"}, row
        assert row["answer"].startswith("stop: ok: stopped at step 4"), row
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
