"""Nothing in ``output_dir`` makes the experiment wait forever: every file read back from it is
opened without blocking and checked to be a regular file before a byte is read, so a FIFO, a
socket or a device put where the experiment keeps a file is one clear error naming the path,
within seconds (a FIFO would block a plain ``open()`` until someone writes to it: forever).
Optuna opens its journal itself, so that path is checked before Optuna is handed it."""

from __future__ import annotations

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
