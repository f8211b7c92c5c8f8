"""A converted TRL script under ``accelerate launch`` (two processes, on CPU) saves once.

Plain TRL under a launch prints from every rank (a script's ``print`` runs in each process)
but ``save_model`` writes from the main process only (``args.should_save``). Every RF worker
holds the best run in a trainer that sees a world of one, so before the fix every worker wrote
the same folder at once. The script records each real write (``Trainer._save`` with
``should_save``) of the folder it saves to; the folder must hold what plain TRL's
``save_model`` writes, and the best run's adapter.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from launched import ONE_MACHINE_LAUNCH, launch_env
from safetensors.torch import load_file
from trl import SFTConfig, SFTTrainer

from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

pytestmark = pytest.mark.slow

# TRL's own shape (trl/scripts/sft.py): train, then save, then say so. Only the import line is
# converted; learning_rate became a knob. The two lines after the imports count real writes.
SCRIPT = textwrap.dedent('''
    import os, sys

    import transformers
    from trl_rapidfire import List, RFSFTConfig as SFTConfig, RFSFTTrainer as SFTTrainer
    from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset,
                                       tiny_lora_config, tiny_model_path)

    out, best, log = sys.argv[1], sys.argv[2], sys.argv[3]
    save = transformers.Trainer._save

    def counted(self, output_dir=None, state_dict=None):
        if output_dir == best and self.args.should_save:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\\n")
        return save(self, output_dir, state_dict)

    transformers.Trainer._save = counted
    args = SFTConfig(output_dir=out, learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                     per_device_train_batch_size=4, logging_steps=1, seed=5,
                     **dict(cpu_training_kwargs(), use_cpu=True, ddp_backend="gloo"))
    trainer = SFTTrainer(model=tiny_model_path(), args=args,
                         train_dataset=make_sft_dataset(16, seed=3),
                         peft_config=tiny_lora_config(r=4))
    trainer.train()
    print("Training completed; best:", trainer.best_run.name, flush=True)
    trainer.save_model(best)
    print("Model saved", flush=True)
    # TRL's other main-process-only steps: asked, and saving the state (counted writes).
    print("zero:", trainer.is_world_process_zero(), flush=True)
    state_save = transformers.TrainerState.save_to_json

    def counted_state(self, json_path):
        if os.path.dirname(json_path) == os.path.join(out, "runs", trainer.best_run.name):
            with open(log + ".state", "a") as f:
                f.write(f"{os.getpid()}\\n")
        return state_save(self, json_path)

    transformers.TrainerState.save_to_json = counted_state
    trainer.save_state()
''')


def test_a_converted_script_under_a_two_process_launch_saves_once(tmp_path):
    tiny_model_path()  # built once, before the workers race to build it
    script = tmp_path / "converted.py"
    script.write_text(SCRIPT)
    out, best, log = tmp_path / "out", tmp_path / "best", tmp_path / "saves.log"
    proc = subprocess.run([sys.executable, *ONE_MACHINE_LAUNCH, str(script), str(out),
                           str(best), str(log)], env=launch_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    # Both workers ran the script to its end, as both ranks of a plain TRL launch do.
    assert proc.stdout.count("Training completed") == 2, proc.stdout
    assert proc.stdout.count("Model saved") == 2, proc.stdout
    # The folder was written once, by one process.
    assert len(log.read_text().split()) == 1, log.read_text()
    # One worker is the launch's main process, as one rank of plain TRL's is; the best run's
    # state was saved once, by it.
    assert sorted(re.findall(r"zero: (True|False)", proc.stdout)) == ["False", "True"]
    state_log = Path(str(log) + ".state")
    assert len(state_log.read_text().split()) == 1, state_log.read_text()
    assert state_log.read_text().split() == log.read_text().split()

    # What plain TRL's save_model writes, holding the best run's adapter.
    plain = SFTTrainer(model=tiny_model_path(), train_dataset=make_sft_dataset(16, seed=3),
                       peft_config=tiny_lora_config(r=4),
                       args=SFTConfig(output_dir=str(tmp_path / "plain"), max_steps=1,
                                      per_device_train_batch_size=4, **cpu_training_kwargs()))
    plain.save_model(str(tmp_path / "plain" / "best"))
    assert _names(best) == _names(tmp_path / "plain" / "best")
    finals = {p.parent.parent.name: load_file(p)
              for p in out.glob("runs/run-*/final/adapter_model.safetensors")}
    saved = load_file(best / "adapter_model.safetensors")
    assert len(finals) == 2
    (best_run,) = set(re.findall(r"best: (run-\d)", proc.stdout))  # the workers agree
    want = finals[best_run]
    assert saved.keys() == want.keys()
    assert all(torch.equal(saved[k], want[k]) for k in want)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())
