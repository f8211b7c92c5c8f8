"""Training settings for tiny CPU runs: the flags every one needs, a LoRA config for the tiny
model, and FSDP's sharded path on CPU for tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from peft import LoraConfig
from transformers import TrainingArguments

__all__ = ["cpu_training_kwargs", "fsdp_on_cpu", "tiny_lora_config"]


def _checkpointing_flag() -> str:
    names = {field.name for field in dataclasses.fields(TrainingArguments)}
    new_name = "activation_checkpointing"
    return new_name if new_name in names else "gradient_checkpointing"


def cpu_training_kwargs() -> dict[str, Any]:
    """Flags every tiny CPU run needs; splat into ``SFTConfig``, ``DPOConfig`` or ``GRPOConfig``.

    Only flags whose TRL 1.16 / transformers 5 default is wrong or costly for a tiny CPU run are
    set, and none that changes how a trainer picks its device or distributed mode.
    """
    return {
        # TRL configs default bf16 to True, and TrainingArguments then raises on a CPU-only
        # machine unless use_cpu=True. use_cpu is left out on purpose: it would also pin runs to
        # the CPU on GPU machines and, under torchrun, turns every trainer into a DDP run.
        "bf16": False,
        # TRL defaults gradient_checkpointing to True: on a ~124k-parameter model it saves no
        # memory and only recomputes forward passes. transformers 5 renamed the flag; setting
        # the new name also avoids the FutureWarning that the old one triggers on every config.
        _checkpointing_flag(): False,
        # Already the default in transformers 5; explicit because mlflow is installed, and an
        # "all" default (as in transformers 4) would make every tiny run log to ./mlflow.db.
        "report_to": "none",
        # Defaults to True; without an accelerator torch pins nothing and warns on every
        # DataLoader, and on a GPU the tiny batches gain nothing from pinned memory.
        "dataloader_pin_memory": False,
        # The default "steps" strategy writes a full checkpoint when training ends, even when
        # max_steps < save_steps: slow disk I/O that tiny runs never need.
        "save_strategy": "no",
        # Progress bars only clutter test and benchmark output (log dicts are still printed).
        "disable_tqdm": True,
    }


def tiny_lora_config(
    r: int = 8, target_modules: Sequence[str] = ("q_proj", "v_proj"), **kwargs: Any
) -> LoraConfig:
    """A ``LoraConfig`` for the tiny model (``task_type="CAUSAL_LM"``).

    Defaults to ``lora_alpha=2 * r`` and ``lora_dropout=0.0`` (dropout would only add noise to
    step-by-step comparisons); ``kwargs`` override these or add other ``LoraConfig`` fields.
    """
    options: dict[str, Any] = {"lora_alpha": 2 * r, "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}
    options.update(kwargs)
    return LoraConfig(r=r, target_modules=list(target_modules), **options)


def fsdp_on_cpu() -> None:
    """Make accelerate shard a trainer's model with FSDP on CPU, as it does on GPUs (tests).

    accelerate selects its FSDP mode only for GPU-like devices: on CPU a trainer given
    ``fsdp``/``fsdp_config`` under a launch is wrapped in DDP instead, silently, so neither
    plain TRL nor trl-rapidfire would ever run the sharded path here. After this call (once per
    process, before any trainer is built), an ``AcceleratorState`` that holds an FSDP plugin
    in a multi-process CPU world is in FSDP mode: ``Accelerator.prepare`` applies FSDP2's
    ``fully_shard`` (gloo collectives), parameters become ``DTensor`` shards, and the
    Trainer's FSDP checkpoint routines run. It is checked after every ``AcceleratorState()``
    construction because each one copies the process state's (CPU) mode over its own.

    Tests use it on both sides of an equivalence, the reference trained by plain TRL and the
    run trained by trl-rapidfire, so both shard.
    """
    # A test bed's patch of accelerate, kept out of the package's wall around accelerate
    # (runtime/accelerate_state.py), which only reads its mark.
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    from ..runtime.accelerate_state import FSDP_ON_CPU_MARK, fsdp_on_cpu_installed

    if fsdp_on_cpu_installed():
        return
    original = AcceleratorState.__init__

    def init(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type != DistributedType.MULTI_CPU:
            return
        if fsdp_plugin is not None and getattr(self, "fsdp_plugin", None) is None:
            self.fsdp_plugin = fsdp_plugin  # what accelerate does for GPUs
        if getattr(self, "fsdp_plugin", None) is not None:
            self.distributed_type = DistributedType.FSDP

    setattr(init, FSDP_ON_CPU_MARK, True)
    AcceleratorState.__init__ = init
