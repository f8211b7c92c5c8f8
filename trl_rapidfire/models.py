"""Base models shared by the runs that use them.

Runs that train LoRA (any PEFT) adapters on the same base model share ONE loaded copy of it:
the :class:`ModelPool` loads each distinct base model once and wraps it in one multi-adapter
``PeftModel`` in which every run has an adapter of its own (PEFT's ``add_adapter`` /
``set_adapter``). Only the active adapter takes part in the forward pass and only its weights
require gradients, so a run trains exactly as it would on a model holding its adapter alone.

Full fine-tuning runs of the same base model share one module object too; their weights are
swapped in and out of it (:mod:`trl_rapidfire.residency`), starting from a copy of the
pretrained weights kept in the state cache.

Adapter names are ``rf<index>``: PEFT and the Trainer look at parameter *names* (weight decay
skips names containing ``bias`` or ``norm``), so a user's run name never becomes part of one.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import set_seed

__all__ = ["ModelGroup", "ModelPool", "adapter_name", "adapter_params"]


def adapter_name(index: int) -> str:
    """The PEFT adapter name of run ``index``."""
    return f"rf{index}"


def adapter_params(model: torch.nn.Module, adapter: str) -> list[torch.nn.Parameter]:
    """The parameters that belong to ``adapter`` (LoRA A/B, DoRA magnitudes, modules to save,
    trainable tokens), in module order."""
    tag = f".{adapter}."
    end = f".{adapter}"
    return [p for n, p in model.named_parameters() if tag in n or n.endswith(end)]


def _kwargs_key(kwargs: dict[str, Any]) -> str:
    return json.dumps(kwargs, sort_keys=True, default=repr)


@dataclass
class ModelGroup:
    """One loaded base model and the runs that train on it.

    Attributes:
        key: identifies the base model (path and load arguments, or the object passed in) and
            the kind of training (``"peft:<type>"`` or ``"full"``).
        base: the model as loaded (or as passed in).
        model: what the runs' trainers get: the multi-adapter ``PeftModel`` for PEFT groups,
            ``base`` itself for full fine-tuning.
        runs: names of the runs in the group.
        processing_class: the tokenizer/processor shared by the group's runs (or ``None``).
    """

    key: str
    base: Any
    model: Any
    peft: bool
    runs: list[str] = field(default_factory=list)
    processing_class: Any = None
    initial_weights: list[torch.Tensor] | None = None

    def add_adapter(self, name: str, peft_config: Any, seed: int) -> list[torch.nn.Parameter]:
        """Add run adapter ``name`` initialised exactly as ``SFTTrainer`` would initialise it
        (``set_seed(seed)`` right before PEFT creates it). Returns its parameters."""
        from peft import PeftModel, get_peft_model

        config = copy.deepcopy(peft_config)
        set_seed(seed)
        if isinstance(self.model, PeftModel):
            self.model.add_adapter(name, config)
        else:
            self.model = get_peft_model(self.base, config, adapter_name=name)
        return adapter_params(self.model, name)


class ModelPool:
    """Loads each distinct base model once and groups the runs that share it.

    Attributes:
        loads: how many times each model key was loaded from a path (tests assert 1).
    """

    def __init__(self) -> None:
        self.groups: dict[str, ModelGroup] = {}
        self.loads: Counter[str] = Counter()
        self._objects: dict[int, Any] = {}

    def group(
        self,
        model: Any,
        *,
        peft_config: Any,
        model_init_kwargs: dict[str, Any] | None,
        trust_remote_code: bool = False,
    ) -> ModelGroup:
        """The group for runs of ``model`` (a path/name or a model object) trained with
        ``peft_config`` (``None``: full fine-tuning), loading the model if it is new."""
        if isinstance(model, str):
            init_kwargs = dict(model_init_kwargs or {})
            init_kwargs.setdefault("trust_remote_code", trust_remote_code)
            source = f"path:{model}:{_kwargs_key(init_kwargs)}"
        else:
            init_kwargs = None
            self._objects[id(model)] = model  # keep it alive so the id stays unique
            source = f"object:{id(model)}"
        kind = f"peft:{peft_config.peft_type}" if peft_config is not None else "full"
        key = f"{source}|{kind}"
        if key in self.groups:
            return self.groups[key]

        if isinstance(model, str):
            base = self._load(model, init_kwargs or {}, source)
        elif any(g.key.startswith(source + "|") for g in self.groups.values()):
            # The object already backs another kind of training (adapters were injected into
            # it, or its weights are being fine-tuned): this kind gets its own copy.
            base = copy.deepcopy(model)
        else:
            base = model
        group = ModelGroup(key=key, base=base, model=base, peft=peft_config is not None)
        self.groups[key] = group
        return group

    def _load(self, model_id: str, init_kwargs: dict[str, Any], source: str) -> Any:
        from trl.trainer.utils import create_model_from_path

        self.loads[source] += 1
        return create_model_from_path(model_id, **init_kwargs)
