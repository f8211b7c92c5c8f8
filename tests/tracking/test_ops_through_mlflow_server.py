"""Control from the MLflow UI, for real: a ``mlflow server`` on 127.0.0.1 and ops sent through
its REST API (``POST /api/2.0/mlflow/runs/set-tag``, what the UI's tag editor calls) against a
running experiment."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from mlflow_server import free_port, mlflow_server, wait_until_up
from safetensors.torch import load_file
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("server") / "mlflow.db") as url:
        yield url


def _rest(url: str, path: str, payload: dict | None = None) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(f"{url}{path}", data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as err:
        raise AssertionError(f"{path}: {err.code} {err.read().decode()}") from None


class _Person(TrainerCallback):
    """What a person clicks in the UI, at given steps of run-0 (learning rate 1e-3)."""

    def __init__(self, url: str, plan: dict[int, list[tuple[str, str]]]):
        self.url, self.plan, self.trainer = url, plan, None

    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate != 1e-3 or state.global_step not in self.plan:
            return
        tracker = self.trainer.engine.tracker
        for run, op in self.plan.pop(state.global_step):
            run_id = tracker.run_id(run)
            # As the guide says: set a run's next op once its previous one was taken.
            deadline = time.monotonic() + 60
            while "rapidfire.op" in _tags(self.url, run_id):
                assert time.monotonic() < deadline, f"{run}'s previous op was never taken"
                time.sleep(0.05)
            _rest(self.url, "/api/2.0/mlflow/runs/set-tag",
                  {"run_id": run_id, "key": "rapidfire.op", "value": op})
        tracker.poll_now()


def _tags(url: str, run_id: str) -> dict[str, str]:
    run = _rest(url, f"/api/2.0/mlflow/runs/get?run_id={run_id}")["run"]
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def test_ops_from_the_ui_take_effect_at_the_next_boundary(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    path = tiny_model_path()
    data = make_sft_dataset(32)
    lora = tiny_lora_config(r=4, lora_dropout=0.1)
    common = dict(cpu_training_kwargs(), per_device_train_batch_size=4, logging_steps=1,
                  num_chunks=4, max_steps=8)
    person = _Person(server, {
        4: [("run-1", "stop")],
        6: [("run-1", "resume"), ("run-2", "delete")],
        8: [("run-0", 'clone {"learning_rate": 2e-3}'),
            ("run-1", 'clone-warm {"learning_rate": 5e-4}')],
    })
    rf = RFSFTTrainer(
        model=path,
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List([1e-3, 3e-3, 1e-4]),
                         **{**common, "report_to": "mlflow"}),
        train_dataset=data, peft_config=lora, callbacks=[person],
    )
    for name in rf.engine.slots:  # each run's trainer, built now if it was planned
        next(cb for cb in rf.run_trainer(name).callback_handler.callbacks
             if isinstance(cb, _Person)).trainer = rf
    rf.train()

    # Ops set at the same moment on different runs apply at the same boundary, in any order
    # (a run's tag holds one op at a time).
    results = {(r.run, r.op): r.result for r in rf.op_log}
    assert len(rf.op_log) == 5, [(r.run, r.op, r.result) for r in rf.op_log]
    assert results[("run-1", "stop")] == "ok: stopped at step 2"
    assert results[("run-1", "resume")] == "ok: resumed at step 2"
    assert results[("run-2", "delete")] == "ok: deleted"
    cold = results[("run-0", 'clone {"learning_rate": 2e-3}')]
    warm = results[("run-1", 'clone-warm {"learning_rate": 5e-4}')]
    assert {cold, warm} == {f"ok: created run-{i}" + (" warm-started from run-1" if w else "")
                            for i, w in ((3, cold.endswith("run-4")), (4, cold.endswith("run-3")))}
    warm_name = warm.split()[2]
    assert {r.name: r.status for r in rf.runs} == {
        "run-0": RunStatus.COMPLETED, "run-1": RunStatus.COMPLETED, "run-2": RunStatus.DELETED,
        "run-3": RunStatus.COMPLETED, "run-4": RunStatus.COMPLETED}
    assert {r.name: r.knobs["learning_rate"] for r in rf.runs}[warm_name] == 5e-4
    tracker = rf.engine.tracker
    for name, status in (("run-1", "FINISHED"), ("run-2", "KILLED"), (warm_name, "FINISHED")):
        run = _rest(server, f"/api/2.0/mlflow/runs/get?run_id={tracker.run_id(name)}")["run"]
        tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
        assert run["info"]["status"] == status
        assert "rapidfire.op" not in tags
        if name == warm_name:
            assert tags["rapidfire.parent"] == "run-1" and tags["rapidfire.warm_start"] == "true"
        else:
            assert tags["rapidfire.op.result"].startswith("ok: ")

    # Runs the ops did not touch (run-0), or only paused (run-1), end bitwise as they would
    # have trained alone.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'ref.db'}")
    ref = RFSFTTrainer(model=path, train_dataset=data, peft_config=lora,
                       args=RFSFTConfig(output_dir=str(tmp_path / "ref"),
                                        learning_rate=List([1e-3, 3e-3]),
                                        **{**common, "report_to": "none"}))
    ref.train()
    for name in ("run-0", "run-1"):
        got = load_file(Path(tmp_path / "exp" / "runs" / name / "final" /
                             "adapter_model.safetensors"))
        want = load_file(Path(tmp_path / "ref" / "runs" / name / "final" /
                              "adapter_model.safetensors"))
        assert all(torch.equal(got[k], want[k]) for k in want), name


def test_dashboard_command_serves_the_store_and_stops_cleanly(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trl_rapidfire.client.cli", "dashboard", "--port", str(port),
         "--uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--create"],  # a new, empty store
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        first = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in first
        wait_until_up(f"http://127.0.0.1:{port}", proc)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=60) == 0
        # Nothing is left listening: the server's whole process group went with it.
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
