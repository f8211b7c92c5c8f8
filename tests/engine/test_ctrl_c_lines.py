"""What a person reads after pressing Ctrl-C in a script: one line, no traceback.

A real process gets a real SIGINT (it sends it to itself at a given step of run-1, the way a
terminal delivers Ctrl-C to the foreground process), through trl-rapidfire's own handler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch
    from transformers import TrainerCallback
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset,
                                       tiny_lora_config, tiny_model_path)

    class CtrlC(TrainerCallback):
        def __init__(self, steps):
            self.steps = steps

        def on_step_begin(self, args, state, control, **kwargs):
            if args.output_dir.endswith("run-1") and state.global_step in self.steps:
                os.kill(os.getpid(), signal.SIGINT)

    torch.set_num_threads(1)
    steps = {int(s) for s in sys.argv[2].split(",")}
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=sys.argv[1], learning_rate=List([1e-3, 3e-3]),
                         num_chunks=2, per_device_train_batch_size=4, logging_steps=1,
                         **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(32, seed=1), peft_config=tiny_lora_config(r=4),
        callbacks=[CtrlC(steps)])
    rf.train()
""")


def _run(tmp_path: Path, steps: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
    return subprocess.run([sys.executable, str(script), str(tmp_path / "exp"), steps],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def _said(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines()
            if line.startswith("trl-rapidfire") or "Traceback" in line or "Error" in line]


@pytest.mark.slow
@pytest.mark.parametrize(("steps", "last"), [
    ("1", "trl-rapidfire: stopped at a chunk boundary: every finished chunk is kept"),
    ("1,2", "trl-rapidfire: stopped at once, mid-chunk: each run is kept as of its last "
            "finished chunk"),
], ids=["once", "twice"])
def test_a_ctrl_c_ends_a_script_with_one_line_saying_what_was_kept(tmp_path, steps, last):
    proc = _run(tmp_path, steps)
    said = _said(proc)
    assert "Traceback (most recent call last):" not in proc.stderr, proc.stderr[-3000:]
    # The first press says what happens next; the script's last line says what was kept.
    assert said[0].startswith("trl-rapidfire: stopping at the next chunk boundary"), said
    assert said[-1].startswith(last), said
    assert proc.stderr.rstrip().splitlines()[-1].startswith(last), proc.stderr[-2000:]
    # Still Ctrl-C's exit, as for any script a person interrupts (a shell sees 130).
    assert proc.returncode == -signal.SIGINT, proc.returncode
    # What it says was kept was kept: a re-run continues from the runs' boundaries.
    assert (tmp_path / "exp" / ".rapidfire" / "scheduler.json").is_file()
