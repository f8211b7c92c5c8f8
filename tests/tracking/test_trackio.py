"""report_to="trackio": one trackio run per RF run, in the config's project, holding that
run's metrics, although trackio keeps one current run per process and the runs train in
turns. W&B, which would merge the runs, is refused before training."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

pytest.importorskip("trackio")

# Run in a process of its own: trackio reads TRACKIO_DIR (where its databases go) on import.
SCRIPT = """
import json, sys
from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset, tiny_lora_config,
                                   tiny_model_path)
kwargs = dict(cpu_training_kwargs(), report_to="trackio", project="rf-project")
trainer = RFSFTTrainer(
    model=tiny_model_path(), train_dataset=make_sft_dataset(24, seed=1),
    peft_config=tiny_lora_config(r=4),
    args=RFSFTConfig(output_dir=sys.argv[1], learning_rate=List([1e-3, 3e-3, 1e-2]),
                     num_chunks=3, per_device_train_batch_size=4, num_train_epochs=1,
                     logging_steps=1, **kwargs))
trainer.train()
json.dump({r.name: [(e["step"], e["loss"]) for e in trainer.run_trainer(r.name).state.log_history
                    if "loss" in e] for r in trainer.runs}, open(sys.argv[2], "w"))
"""


def test_each_run_is_one_trackio_run_with_its_own_metrics(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRACKIO_DIR=str(tmp_path / "trackio"),
               OMP_NUM_THREADS="1")
    out, losses = tmp_path / "exp", tmp_path / "losses.json"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(losses)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    expected = json.loads(losses.read_text())
    read = """
import json
from trackio.sqlite_storage import SQLiteStorage
runs = SQLiteStorage.get_runs("rf-project")
print(json.dumps({run: [(e["train/global_step"], e["train/loss"]) for e in SQLiteStorage.get_logs(
    "rf-project", run) if "train/loss" in e] for run in runs}))
print(json.dumps(SQLiteStorage.get_projects()))
"""
    proc = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    streams, projects = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert projects == ["rf-project"]
    # Interleaved in 3 chunks each, every run's points went to its own trackio run.
    assert streams == {f"exp-{run}": [list(p) for p in points]
                       for run, points in expected.items()}
    assert all(len(points) == 6 for points in streams.values())


def test_wandb_with_several_runs_is_refused_before_training(tmp_path):
    with pytest.raises(RFConfigError, match="report_to='wandb' with several runs"):
        RFSFTTrainer(
            model=tiny_model_path(), train_dataset=make_sft_dataset(8),
            peft_config=tiny_lora_config(r=4),
            args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List([1e-3, 3e-3]),
                             **dict(cpu_training_kwargs(), report_to="wandb")))
    assert not (tmp_path / "exp" / "runs").exists()
