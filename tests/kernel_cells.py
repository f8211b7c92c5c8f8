"""The first cell of the real-kernel tests: the tiny offline experiment a notebook user
builds (three learning rates on the tiny model, one torch thread). ``before`` goes first
(e.g. making ``ipywidgets`` unimportable); the trainer is ``trainer``."""

from __future__ import annotations

SETUP = """\
import os, sys, json
{before}os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (cpu_training_kwargs, make_sft_dataset, tiny_lora_config,
                                   tiny_model_path)
config = RFSFTConfig(output_dir={out!r}, learning_rate=List([1e-3, 3e-3, 1e-2]),
                     num_chunks={chunks}, per_device_train_batch_size=4, num_train_epochs=1,
                     **dict(cpu_training_kwargs(){extra}))
trainer = RFSFTTrainer(model=tiny_model_path(), args=config,
                       train_dataset=make_sft_dataset({rows}, seed=1),
                       peft_config=tiny_lora_config(r=4))
"""


def setup_cell(out: str, *, rows: int, chunks: int, before: str = "", extra: str = "") -> str:
    """The setup cell's code for an experiment in ``out``; ``extra``: more config arguments
    as Python text (``", disable_tqdm=False"``)."""
    return SETUP.format(out=out, rows=rows, chunks=chunks, before=before, extra=extra)
