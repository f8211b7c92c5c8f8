"""Each run of an RF SFT experiment against plain TRL: its config trained alone by
``SFTTrainer`` on the same data ends with the same adapter, bitwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from trl import SFTConfig, SFTTrainer

from trl_rapidfire.testing import make_sft_dataset, tiny_lora_config, tiny_model_path


def assert_each_run_is_plain_sft(rf: Any, out: Path, plain: Path, config: dict[str, Any], *,
                                 rows: int, r: int = 4) -> None:
    """Trains each of ``rf``'s runs alone (``config`` plus the run's knobs, ``rows`` rows of
    ``make_sft_dataset(seed=1)``, LoRA rank ``r``) under ``plain``, and asserts its final
    adapter equals the run's in ``out``, tensor by tensor."""
    for run in rf.runs:
        alone = SFTTrainer(model=tiny_model_path(),
                           args=SFTConfig(output_dir=str(plain / run.name), **config, **run.knobs),
                           train_dataset=make_sft_dataset(rows, seed=1),
                           peft_config=tiny_lora_config(r=r))
        alone.train()
        alone.save_model(str(plain / run.name / "final"))
        ours = load_file(Path(out) / "runs" / run.name / "final" / "adapter_model.safetensors")
        theirs = load_file(plain / run.name / "final" / "adapter_model.safetensors")
        assert ours.keys() == theirs.keys(), run.name
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), run.name
