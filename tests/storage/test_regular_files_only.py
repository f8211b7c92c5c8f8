"""Nothing in ``output_dir`` makes the experiment wait forever: every file read back from it is
opened without blocking and checked to be a regular file before a byte is read, so a FIFO, a
socket or a device put where the experiment keeps a file is one clear error naming the path,
within seconds (a FIFO would block a plain ``open()`` until someone writes to it: forever).
Optuna opens its journal itself, so that path is checked before Optuna is handed it."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trl_rapidfire.storage.own_files import LinkRefused, read_bytes, read_json

# Far beyond building a tiny experiment on a busy CPU, far below forever.
HUNG_AFTER = 120


def _plant(path: Path, kind: str) -> socket.socket | None:
    """Put a ``kind`` (fifo, socket, device) at ``path``; the socket is returned (to close)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        return sock
    else:
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
        except PermissionError:
            pytest.skip("making a device node needs root")
    return None


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_a_file_read_back_is_refused_unless_it_is_a_regular_file(tmp_path, kind):
    path = tmp_path / ".rapidfire" / "scheduler.json"
    sock = _plant(path, kind)
    try:
        start = time.monotonic()
        for read in (read_bytes, read_json):
            with pytest.raises(LinkRefused, match=f"{path} is not a regular file"):
                read(path)
        assert time.monotonic() - start < 5
    finally:
        if sock is not None:
            sock.close()


_EXPERIMENT = """
import os, socket, sys
from pathlib import Path
from trl_rapidfire import Range, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.integrations.optuna.search import OptunaSearch
from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset, tiny_lora_config,
                                   tiny_model_path)

out, kind = Path(sys.argv[1]), sys.argv[2]
journal = out / ".rapidfire" / "optuna.journal"
journal.parent.mkdir(parents=True)
if kind == "fifo":
    os.mkfifo(journal)
else:
    keep = socket.socket(socket.AF_UNIX)
    keep.bind(str(journal))
kw = {k: v for k, v in cpu_training_kwargs().items() if k != "report_to"}
try:
    RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), num_chunks=2, max_steps=2, report_to="none",
                         learning_rate=Range(1e-4, 1e-2, log=True), **kw),
        train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4),
        search=OptunaSearch(num_runs=2, max_concurrent=1, metric="loss"))
except Exception as err:
    print(f"REFUSED {type(err).__name__}: {err}")
else:
    print("BUILT")
"""


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_fifo_or_socket_at_the_optuna_journal_is_an_error_naming_it(tmp_path, kind):
    pytest.importorskip("optuna")
    script = tmp_path / "experiment.py"
    script.write_text(textwrap.dedent(_EXPERIMENT))
    out = tmp_path / "exp"
    try:
        done = subprocess.run([sys.executable, str(script), str(out), kind], capture_output=True,
                              text=True, timeout=HUNG_AFTER, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a {kind} at optuna.journal hung the experiment's build")
    journal = out / ".rapidfire" / "optuna.journal"
    assert f"REFUSED StoreError: {journal} is not a regular file" in done.stdout, (
        done.stdout, done.stderr[-3000:])


def test_tensor_readers_get_the_file_as_opened_never_its_name(tmp_path):
    """safetensors and torch.load take a path: they are handed the descriptor's, so a link or a
    FIFO at the name is refused, and a file swapped in after the check is not what they read."""
    import torch
    from safetensors.torch import load_file, save_file

    from trl_rapidfire.storage.own_files import read_by_descriptor

    path = tmp_path / "t.safetensors"
    save_file({"w": torch.ones(2)}, str(path))
    with read_by_descriptor(path) as opened:
        os.replace(_other(tmp_path, torch.zeros(2)), path)  # swapped after the check
        assert torch.equal(load_file(opened)["w"], torch.ones(2))
    assert torch.equal(load_file(str(path))["w"], torch.zeros(2))  # the name moved on

    (tmp_path / "link.safetensors").symlink_to(path)
    with pytest.raises(LinkRefused, match="link"):
        with read_by_descriptor(tmp_path / "link.safetensors"):
            pass
    os.mkfifo(tmp_path / "fifo.pt")
    start = time.monotonic()
    with _never_hung(tmp_path / "fifo.pt"), pytest.raises(LinkRefused, match="not a regular"):
        with read_by_descriptor(tmp_path / "fifo.pt"):
            pass
    assert time.monotonic() - start < 5


@contextlib.contextmanager
def _never_hung(*fifos: Path, after: float = 10.0):
    """If a reader blocks on one of ``fifos`` (the bug these tests catch), a writer opens it
    after ``after`` seconds, so the reader returns and the test fails instead of hanging. The
    writer is another process: a reader blocked in native code (safetensors) holds the GIL."""
    script = 'sleep "$0"; for f in "$@"; do timeout 2 sh -c \': > "$0"\' "$f"; done'
    writer = subprocess.Popen(["sh", "-c", script, str(after), *map(str, fifos)])
    try:
        yield
    finally:
        writer.kill()
        writer.wait()


def _other(folder: Path, value) -> Path:
    from safetensors.torch import save_file

    other = folder / "other.safetensors"
    save_file({"w": value}, str(other))
    return other


def test_a_fifo_in_a_parked_state_or_a_checkpoint_is_an_error_naming_it(tmp_path):
    """The state cache's spilled trees, a parent's checkpoint read for a warm start, and the log
    state a resumed run reads: each refuses a FIFO (or a link) at once instead of waiting."""
    import torch
    from safetensors.torch import save_file

    from trl_rapidfire.runtime.state_tree import TENSORS_FILE, load_tree, save_tree
    from trl_rapidfire.storage.checkpoints import run_state_from_checkpoint
    from trl_rapidfire.trainers.log_state import LOG_STATE_NAME, arm

    tree = tmp_path / "tree"
    save_tree({"params": [torch.ones(3)]}, tree)
    assert torch.equal(load_tree(tree)["params"][0], torch.ones(3))
    (tree / TENSORS_FILE).unlink()
    os.mkfifo(tree / TENSORS_FILE)

    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    param = torch.nn.Parameter(torch.ones(3))
    save_file({"w": torch.ones(3)}, str(ckpt / "adapter_model.safetensors"))
    os.mkfifo(ckpt / "optimizer.pt")
    os.mkfifo(ckpt / LOG_STATE_NAME)

    class _Args:
        world_size = 1

    class _Trainer:
        args = _Args()

    start = time.monotonic()
    with _never_hung(tree / TENSORS_FILE, ckpt / "optimizer.pt", ckpt / LOG_STATE_NAME):
        with pytest.raises(LinkRefused, match=f"{tree / TENSORS_FILE} is not a regular file"):
            load_tree(tree)
        with pytest.raises(LinkRefused, match=f"{ckpt / 'optimizer.pt'} is not a regular"):
            run_state_from_checkpoint(ckpt, [("w", param)], None, set())
        with pytest.raises(LinkRefused, match=f"{ckpt / LOG_STATE_NAME} is not a regular"):
            arm(_Trainer(), ckpt)
    assert time.monotonic() - start < 5
