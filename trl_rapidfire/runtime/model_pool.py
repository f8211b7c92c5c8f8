"""The base models the runs train on, each loaded once, and where they sit on the device.

The :class:`ModelPool` loads each distinct base model once (a path with its load arguments, or
a model object the script passed) and keeps one :class:`~trl_rapidfire.runtime.models.ModelGroup`
per base model and kind of training: the runs that share it train adapters on it, or (full
fine-tuning) swap their weights in and out of it (:mod:`trl_rapidfire.runtime.residency`),
starting from a copy of the pretrained weights kept in the state cache.

Several distinct base models live within the device's memory: on a CUDA device, before a
group computes, the least recently used other groups are offloaded to host memory until the
group fits (:meth:`ModelPool.make_room`), and reloaded when their turn comes. Tensors move
inside the existing parameter objects, so optimizers and the state cache stay valid.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from transformers import set_seed

from .models import ModelGroup
from .switch import RngState

__all__ = ["BaseModelLoad", "ModelPool", "choose_offloads", "module_bytes", "move_module"]


def move_module(module: torch.nn.Module, device: torch.device | str) -> None:
    """Move every parameter and buffer of ``module`` to ``device`` in place: the parameter
    objects stay the same (optimizers key their state by them)."""
    device = torch.device(device)
    with torch.no_grad():
        for p in module.parameters():
            if p.device != device:
                p.data = p.data.to(device)
        for m in module.modules():
            for name, b in list(m.named_buffers(recurse=False)):
                if b.device != device:
                    setattr(m, name, b.to(device))  # a buffer stays registered as one


def module_bytes(module: torch.nn.Module, device: torch.device | None = None, *,
                 on: bool = True) -> int:
    """Bytes of the module's parameters and buffers (with ``device``: only those on it, or,
    with ``on=False``, only those elsewhere)."""
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors
               if device is None or (t.device == device) == on)


def choose_offloads(
    resident: list[tuple[str, int]], need: int, free: int, reserve: int = 0
) -> list[str]:
    """Which resident groups to offload so that ``need`` bytes fit.

    Args:
        resident: ``(key, bytes on the device)`` of the other groups on the device, least
            recently used first.
        need: bytes the incoming group still has to bring onto the device.
        free: bytes free on the device now.
        reserve: bytes to keep free beyond ``need`` (activations, optimizer steps).

    Returns the keys to offload, least recently used first: the fewest that make room, or all
    of them when even that is not enough (the incoming group then gets the whole device).
    """
    out = []
    for key, nbytes in resident:
        if free >= need + reserve:
            break
        out.append(key)
        free += nbytes
    return out


@dataclass(frozen=True)
class BaseModelLoad:
    """How a trainer kind loads its base model from a path, as its TRL trainer does.

    Attributes:
        architecture: the auto class (``None``: what TRL loads by default, a causal LM).
        seeded: loading draws weights from the random streams (a new classification head),
            so it is made right after ``set_seed(<the run's seed>)``, once per seed.
        init_kwargs: load arguments the trainer adds (a reward model's ``num_labels=1``).
    """

    architecture: Any = None
    seeded: bool = False
    init_kwargs: tuple[tuple[str, Any], ...] = ()


def _kwargs_key(kwargs: dict[str, Any]) -> str:
    return json.dumps(kwargs, sort_keys=True, default=repr)


class ModelPool:
    """Loads each distinct base model once and groups the runs that share it.

    Attributes:
        loads: how many times each model key was loaded from a path (tests assert 1).
    """

    def __init__(self, reserve_fraction: float = 0.2) -> None:
        self.groups: dict[str, ModelGroup] = {}
        self.loads: Counter[str] = Counter()
        self.offloads: Counter[str] = Counter()
        self.reserve_fraction = reserve_fraction
        self._objects: dict[int, Any] = {}
        self._lru: list[str] = []  # group keys, least recently used first

    def make_room(self, group: ModelGroup, device: torch.device | str) -> None:
        """Before ``group`` computes on ``device``: on a CUDA device, offload least recently
        used other groups to host memory until it fits, then bring it onto the device. On the
        CPU every group is already where it computes: nothing moves."""
        device = torch.device(device)
        if group.key in self._lru:
            self._lru.remove(group.key)
        self._lru.append(group.key)
        if device.type != "cuda":
            return
        need = module_bytes(group.model, device, on=False)
        if need == 0:
            return
        free, total = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        resident = []
        for key in self._lru[:-1]:
            other = self.groups[key]
            on_device = module_bytes(other.model, device)
            if on_device:
                resident.append((key, on_device))
        for key in choose_offloads(resident, need, free, int(self.reserve_fraction * total)):
            move_module(self.groups[key].model, "cpu")
            self.offloads[key] += 1
        torch.cuda.empty_cache()
        move_module(group.model, device)

    def group(
        self,
        model: Any,
        *,
        peft_config: Any,
        model_init_kwargs: dict[str, Any] | None,
        trust_remote_code: bool = False,
        architecture: Any = None,
        seed: int | None = None,
    ) -> ModelGroup:
        """The group for runs of ``model`` (a path/name or a model object) trained with
        ``peft_config`` (``None``: full fine-tuning), loading the model if it is new.

        ``architecture``: the auto class a path loads with (``None``: the causal LM TRL loads);
        ``seed``: a load that draws weights (a new head) is made after ``set_seed(seed)``, once
        per seed."""
        if isinstance(model, str):
            init_kwargs = dict(model_init_kwargs or {})
            init_kwargs.setdefault("trust_remote_code", trust_remote_code)
            source = f"path:{model}:{_kwargs_key(init_kwargs)}"
            if architecture is not None:
                source += f":{architecture.__name__}"
            if seed is not None:
                source += f":seed={seed}"
        else:
            init_kwargs = None
            self._objects[id(model)] = model  # keep it alive so the id stays unique
            source = f"object:{id(model)}"
        kind = f"peft:{peft_config.peft_type}" if peft_config is not None else "full"
        key = f"{source}|{kind}"
        if key in self.groups:
            return self.groups[key]

        streams = None
        if isinstance(model, str):
            if seed is not None:
                set_seed(seed)
            base = self._load(model, init_kwargs or {}, source, architecture)
            streams = RngState.capture() if seed is not None else None
        elif any(g.key.startswith(source + "|") for g in self.groups.values()):
            # The object already backs another kind of training (adapters were injected into
            # it, or its weights are being fine-tuned): this kind gets its own copy.
            base = copy.deepcopy(model)
        else:
            base = model
        group = ModelGroup(key=key, base=base, model=base, peft=peft_config is not None,
                           streams_after_load=streams)
        self.groups[key] = group
        return group

    def _load(self, model_id: str, init_kwargs: dict[str, Any], source: str,
              architecture: Any = None) -> Any:
        from trl.trainer.utils import create_model_from_path

        self.loads[source] += 1
        return create_model_from_path(model_id, architecture, **init_kwargs)
