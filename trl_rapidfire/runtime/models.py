"""One base model and the runs' adapters on it: which one is in the module tree.

Runs that train LoRA (any PEFT) adapters on the same base model share ONE loaded copy of it
(:class:`~trl_rapidfire.runtime.model_pool.ModelPool` loads it once), wrapped in one
multi-adapter ``PeftModel`` in which every run has an adapter of its own (PEFT's
``add_adapter``). A :class:`ModelGroup` is that model and its runs' adapters. Only the active
adapter is in the model's module tree at all: the others are *detached* (their modules taken
out of PEFT's per-adapter containers, the very objects kept), so everything that walks the
model (the Trainer's ``model.train()``, ``zero_grad``, gradient clipping, parameter grouping,
PEFT's state dicts, FLOP counting) walks the base model and one adapter, whatever the number of
runs. A run trains exactly as it would on a model holding its adapter alone.

A reward model's base (a sequence-classification model) gets a new, random score head when it
loads, drawn from the seed set just before: its group is loaded per seed, and each of its runs'
adapters starts from the random streams as that load left them, as a plain ``RewardTrainer``'s
does (:attr:`ModelGroup.streams_after_load`).

Adapter names are ``rf<index>``: PEFT and the Trainer look at parameter *names* (weight decay
skips names containing ``bias`` or ``norm``), so a user's run name never becomes part of one.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import set_seed

from .foreign_internals import (
    entries_of,
    peft_fast_switch,
    set_layer_active_adapter,
    wrapper_adapters,
    wrapper_copies,
)
from .switch import RngState

__all__ = ["ModelGroup", "adapter_name", "adapter_params"]


def adapter_name(index: int) -> str:
    """The PEFT adapter name of run ``index``."""
    return f"rf{index}"


def adapter_params(model: torch.nn.Module, adapter: str) -> list[torch.nn.Parameter]:
    """The parameters that belong to ``adapter`` (LoRA A/B, DoRA magnitudes, modules to save,
    trainable tokens), in module order."""
    tag = f".{adapter}."
    end = f".{adapter}"
    return [p for n, p in model.named_parameters() if tag in n or n.endswith(end)]




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
    # The first run's settings that its trainer applies to the shared model or tokenizer
    # (run name, {field: value}): the group's later runs must agree with them.
    settings: tuple[str, dict[str, Any]] | None = None
    _tuner_layers: list[Any] | None = field(default=None, repr=False)
    _aux_modules: list[Any] | None = field(default=None, repr=False)
    # adapter -> (container, key, value) entries taken out of the tuner layers by detach()
    _detached: dict[str, list[tuple[Any, str, Any]]] = field(default_factory=dict, repr=False)
    # The adapters in the module tree now (after activate(): the active one alone, unless
    # one cannot be detached); what activate() detaches, without looking at the other runs.
    _attached: set[str] = field(default_factory=set, repr=False)
    # adapter -> the parameters PEFT's set_adapter made trainable for it; and the adapter the
    # last activate() left active (None: its invariant may not hold, e.g. after add_adapter)
    _trainable: dict[str, list[torch.nn.Parameter]] = field(default_factory=dict, repr=False)
    _active: str | None = field(default=None, repr=False)
    _containers: list[tuple[Any, list[Any]]] | None = field(default=None, repr=False)
    # A seeded load (its weights drew from the seed: a new classification head): the random
    # streams right after it, where a plain trainer's adapter starts drawing (see add_adapter).
    streams_after_load: RngState | None = field(default=None, repr=False)

    def activate(self, name: str) -> None:
        """Make adapter ``name`` the active (and only trainable) one.

        Does what ``PeftModel.set_adapter`` does, on lists of the adapter layers found once
        instead of walking every module of the model at every switch (1 ms per switch on the
        tiny test model, far more on a real one). A detached adapter is attached first, and
        every other adapter is detached after (see :meth:`detach`): the model then holds the
        base weights and this adapter only.
        """
        model = self.model
        configs = model.peft_config  # a property reached through PeftModel.__getattr__: once
        if configs[name].is_prompt_learning:
            model.set_adapter(name)
            return
        self.attach(name)
        self._find_layers()
        assert self._tuner_layers is not None and self._aux_modules is not None  # found just now
        prev, self._active = self._active, None
        model.active_adapter = name
        if (prev is not None and prev != name and not self._aux_modules
                and prev in self._trainable and peft_fast_switch()):
            # Only two adapters change trainability: toggling theirs is what set_adapter's
            # walk over every adapter of every layer ends with (9 ms a switch at a 135M
            # model's shape with 8 adapters, against well under 1 ms). An adapter's first
            # activation too: set_adapter makes every parameter of its modules trainable.
            if name not in self._trainable:
                self._trainable[name] = self._adapter_modules_params(name)
            for p in self._trainable[prev]:
                p.requires_grad_(False)
            for p in self._trainable[name]:
                p.requires_grad_(True)
            for layer in self._tuner_layers:
                if layer.merged:
                    layer.unmerge()
                set_layer_active_adapter(layer, name)
        else:
            for module in self._aux_modules:
                target = module.check_set_adapter(name)
                module.set_adapter(target if target in wrapper_adapters(module) else [])
            for layer in self._tuner_layers:
                if layer.merged:
                    layer.unmerge()
                layer.set_adapter(name)
            self._trainable[name] = self._made_trainable(name)
        model.base_model.active_adapter = name
        self._active = name
        for other in list(self._attached - {name}):
            self.detach(other, configs)

    def _made_trainable(self, name: str) -> list[torch.nn.Parameter]:
        return [p for p in self._adapter_modules_params(name) if p.requires_grad]

    def _adapter_modules_params(self, name: str) -> list[torch.nn.Parameter]:
        """The parameters of adapter ``name``'s modules in the tuner layers (what PEFT's
        ``set_adapter(name)`` makes trainable)."""
        assert self._tuner_layers is not None  # activate() found the layers
        out: list[torch.nn.Parameter] = []
        for layer in self._tuner_layers:
            for attr in layer.adapter_layer_names:
                container = getattr(layer, attr, None)
                if container is not None and name in container:
                    value = container[name]
                    out.extend([value] if isinstance(value, torch.Tensor) else value.parameters())
        return out

    def _forget_layers(self) -> None:
        self._tuner_layers = self._aux_modules = self._containers = None
        self._trainable, self._active = {}, None

    def _find_layers(self) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer
        from peft.utils.other import AuxiliaryTrainingWrapper

        if self._tuner_layers is None:
            modules = list(self.model.modules())
            self._tuner_layers = [m for m in modules if isinstance(m, BaseTunerLayer)]
            self._aux_modules = [m for m in modules if isinstance(m, AuxiliaryTrainingWrapper)]
            # Each layer's per-adapter containers, found once, as the dicts that hold their
            # entries: detaching and attaching at every switch then costs a pop and a store
            # per container, not torch's Module.__getattr__/__delattr__ and add_module (most
            # of a switch's time on the tiny model).
            kinds = (dict, torch.nn.ModuleDict, torch.nn.ParameterDict)
            self._containers = [
                (layer, [entries_of(c)
                         for attr in (*layer.adapter_layer_names, *layer.other_param_names)
                         if isinstance(c := getattr(layer, attr, None), kinds)])
                for layer in self._tuner_layers]

    def detach(self, name: str, configs: dict[str, Any] | None = None) -> bool:
        """Take adapter ``name``'s modules out of the model, keeping the very objects.

        Every run but the active one is detached between its turns (:meth:`activate` does
        it): it keeps its parameter objects, so its optimizer and parked state stay valid, but
        the model no longer walks them. The Trainer calls ``model.train()``, ``zero_grad()``
        and gradient clipping over every module and parameter at every step, builds its
        optimizer's parameter groups from a walk over every module, and PEFT's state dicts
        walk the whole model: with every run's adapter attached each of these grew with the
        number of runs (a step at 128 runs cost 5.75x a step at 8 on the tiny model).
        :meth:`attach` puts the modules back as they were.
        Returns whether the adapter was detached (not the active one, not prompt learning,
        no trainable-token wrappers, which keep per-adapter state of their own). ``configs``:
        the model's ``peft_config``, when the caller already holds it.
        """
        model = self.model
        if not self.peft or name in self._detached:
            return False
        configs = model.peft_config if configs is None else configs
        if (name not in configs or name == model.active_adapter
                or configs[name].is_prompt_learning):
            return False
        if self._needs_attached(name):
            return False
        assert self._containers is not None and self._aux_modules is not None  # found
        taken: list[tuple[Any, str, Any]] = []
        for layer, containers in self._containers:
            if name in layer.active_adapters:
                return self._put_back(taken)
            for container in containers:
                if name in container:
                    taken.append((container, name, container.pop(name)))
        for wrapper in self._aux_modules:
            held = wrapper_copies(wrapper)
            if held is not None and name in held[1]:
                # Its copy of a module to save (a score head) and its place in the wrapper's
                # adapters leave together; the wrapper then walks the active copy alone.
                copies, adapters = entries_of(held[0]), held[1]
                taken += [(copies, name, copies.pop(name)), (adapters, name, None)]
                adapters.discard(name)
        self._detached[name] = taken
        self._attached.discard(name)
        return True

    def _needs_attached(self, name: str) -> bool:
        """Adapters that stay in the module tree: a trainable-token wrapper keeps
        per-adapter state that detaching would not cover (a module to save's copies are
        detached with the adapter)."""
        self._find_layers()
        assert self._aux_modules is not None  # found just now
        return any(name in wrapper_adapters(m) and wrapper_copies(m) is None
                   for m in self._aux_modules)

    def attach(self, name: str) -> None:
        """Put a detached adapter's modules back (no-op if it is in the model)."""
        if name in self._detached:
            self._put_back(self._detached.pop(name))
            self._attached.add(name)

    @property
    def attached(self) -> frozenset[str]:
        """The adapters in the model's module tree now (the others are detached)."""
        return frozenset(self._attached)

    @staticmethod
    def _put_back(taken: list[tuple[Any, str, Any]]) -> bool:
        for container, key, value in taken:
            if type(container) is set:  # a modules-to-save wrapper's adapters
                container.add(key)
            else:  # a dict holding a container's entries (see entries_of)
                container[key] = value
        return False

    def delete_adapter(self, name: str) -> None:
        """Remove run adapter ``name`` from the model (a run whose build failed half-way)."""
        peft_config = getattr(self.model, "peft_config", None)
        if isinstance(peft_config, dict) and name in peft_config:
            self.attach(name)  # PEFT deletes what is in the module tree
            self.model.delete_adapter(name)
            self._attached.discard(name)
            self._forget_layers()

    def add_adapter(self, name: str, peft_config: Any, seed: int) -> list[torch.nn.Parameter]:
        """Add run adapter ``name`` initialised exactly as ``SFTTrainer`` would initialise it
        (``set_seed(seed)`` right before PEFT creates it; after a seeded load, the streams as
        that load left them, the group's runs all having its seed). Returns its parameters."""
        from peft import PeftModel, get_peft_model

        config = copy.deepcopy(peft_config)
        self._forget_layers()  # new target modules may appear, PEFT marks what it trains
        if self.streams_after_load is not None:
            self.streams_after_load.restore()
        else:
            set_seed(seed)
        if isinstance(self.model, PeftModel):
            self.model.add_adapter(name, config)
        else:
            with warnings.catch_warnings():
                # PEFT reads the model's is_gradient_checkpointing, an alias transformers 5
                # deprecates: its FutureWarning is about PEFT's code, not the user's (PEFT
                # 0.21), so it is kept from the user; nothing else is.
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                        FutureWarning, "transformers")
                self.model = get_peft_model(self.base, config, adapter_name=name)
        self._attached.add(name)
        return adapter_params(self.model, name)
