"""Moving a run's tensors between the device and the state cache.

A run owns a set of parameters (its LoRA adapter, or every trainable weight for full
fine-tuning) and, once it has trained, its optimizer's state for them. When another run takes
the device, the owner's tensors are *parked*: handed to the
:class:`~trl_rapidfire.runtime.cache.StateCache`
(host memory, spilled to disk beyond its budget) and replaced on the device by empty
placeholders, so the memory is really freed. *Unparking* puts the very values back into the
same parameter and optimizer-state objects. Nothing else of the run moves: its trainer, LR
scheduler and data position never left its ``train()`` call (see
:mod:`trl_rapidfire.runtime.switch`).

Identity is what makes this exact. The optimizer keys its state by parameter object and the
LR scheduler holds the optimizer, so values are swapped *inside* the existing objects
(``param.data = ...``), never by building new ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .cache import StateCache

__all__ = ["Residency", "inner_optimizer"]


def inner_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The ``torch.optim.Optimizer`` behind accelerate's wrapper (or ``None``)."""
    if optimizer is None:
        return None
    return getattr(optimizer, "optimizer", optimizer)


def _placeholder(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype, device=t.device)


@dataclass
class Residency:
    """Where one run's tensors are, and the moves between device and cache.

    Args:
        key: the run's cache key.
        params: the parameters the run owns, in a fixed order.
    """

    key: str
    params: Sequence[torch.nn.Parameter]
    resident: bool = True
    # Where each parked tensor came from, to send it back to the same device.
    _param_devices: list[torch.device] = field(default_factory=list)
    _state_devices: list[dict[str, torch.device]] = field(default_factory=list)
    # What each parameter looks like when live (to give it room again after a drop).
    _layout: list[tuple[torch.Size, torch.dtype]] = field(default_factory=list)
    # Bytes of the live tensors, once every parameter has its optimizer state (it never
    # grows after that: Adam's moments are made at the first step).
    _full_bytes: int | None = None

    def __post_init__(self) -> None:
        self._layout = [(p.shape, p.dtype) for p in self.params]

    def on_host(self) -> bool:
        """Whether the run's live tensors are in host memory (a CPU run's): parking them would
        hand the state cache these very tensors."""
        return self.resident and (not self.params or self.params[0].device.type == "cpu")

    def live_bytes(self, optimizer: Any) -> int:
        """Bytes of the run's resident parameter values and optimizer state (0 when parked)."""
        if not self.resident:
            return 0
        if self._full_bytes is not None:
            return self._full_bytes
        opt = inner_optimizer(optimizer)
        total, complete = 0, opt is not None
        for p in self.params:
            total += p.untyped_storage().nbytes()
            state = opt.state.get(p) if opt is not None else None
            complete = complete and bool(state)
            for v in (state or {}).values():
                if isinstance(v, torch.Tensor):
                    total += v.untyped_storage().nbytes()
        if complete:
            self._full_bytes = total
        return total

    def _optimizer_states(self, optimizer: Any) -> list[dict[str, Any] | None]:
        """The optimizer's per-parameter state dicts, in parameter order (``None``: none)."""
        opt = inner_optimizer(optimizer)
        states = [opt.state.get(p) if opt is not None else None for p in self.params]
        return [dict(state) if state else None for state in states]

    def park(self, cache: StateCache, optimizer: Any) -> None:
        """Hand the run's parameter values and optimizer state to ``cache``; free the device."""
        if not self.resident:
            return
        opt = inner_optimizer(optimizer)
        states = self._optimizer_states(optimizer)
        self._state_devices = [
            {k: v.device for k, v in (state or {}).items() if isinstance(v, torch.Tensor)}
            for state in states
        ]
        self._param_devices = [p.device for p in self.params]
        tree = {"params": [p.data for p in self.params], "optimizer": states}
        # On the CPU the cache can own these very tensors: nobody else will touch them.
        cache.put(self.key, tree, copy=False)
        for p in self.params:
            p.data = _placeholder(p.data)
        if opt is not None:
            for p in self.params:
                opt.state.pop(p, None)
        self.resident = False

    def unpark(self, cache: StateCache, optimizer: Any) -> None:
        """Put the parked values back into the run's parameters and optimizer state."""
        if self.resident:
            return
        tree = cache.pop(self.key)
        opt = inner_optimizer(optimizer)
        for p, value, device in zip(self.params, tree["params"], self._param_devices):
            p.data = value.to(device, non_blocking=True)
        for p, state, devices in zip(self.params, tree["optimizer"], self._state_devices):
            if state is None:
                continue
            if opt is None:
                raise RuntimeError(f"{self.key}: parked optimizer state but no optimizer now.")
            opt.state[p] = {
                k: v.to(devices[k], non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in state.items()
            }
        if any(d.type == "cuda" for d in self._param_devices):
            torch.cuda.current_stream().synchronize()
        self.resident = True

    def copy_state(self, cache: StateCache, optimizer: Any) -> tuple[list[torch.Tensor], list[Any]]:
        """Host copies of the run's parameter values and optimizer states, wherever they are
        (resident, or parked in ``cache``); the run itself is left as it was.

        Raises ``LookupError`` when the run has neither (it was dropped)."""
        if self.resident:
            def host(v: Any) -> Any:
                return v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v

            states = [None if st is None else {k: host(v) for k, v in st.items()}
                      for st in self._optimizer_states(optimizer)]
            return [host(p) for p in self.params], states
        if self.key in cache:
            tree = cache.get(self.key, copy=True)
            return list(tree["params"]), list(tree["optimizer"])
        raise LookupError(self.key)

    def load_optimizer_state(self, optimizer: Any, states: Sequence[Any] | None) -> None:
        """Give the run's optimizer per-parameter states (e.g. a warm clone's parent's)."""
        opt = inner_optimizer(optimizer)
        for p, state in zip(self.params, states or []):
            if state is not None:
                assert opt is not None  # called once the run's optimizer exists
                opt.state[p] = {k: v.to(p.device) if isinstance(v, torch.Tensor) else v
                                for k, v in state.items()}

    def park_values(self, cache: StateCache, values: Sequence[torch.Tensor]) -> None:
        """Park ``values`` as the run's parameter values (no optimizer state yet), for a run
        that is not resident: they go onto the parameters at its first turn."""
        if self.resident:
            raise RuntimeError(f"{self.key} is resident; set its parameters instead")
        cache.put(self.key, {"params": list(values), "optimizer": [None] * len(values)})
        self._param_devices = [p.device for p in self.params]
        self._state_devices = [{} for _ in self.params]

    def load_initial(self, values: Sequence[torch.Tensor]) -> None:
        """Set the run's parameters to ``values`` (copies), e.g. a full fine-tuning run's
        starting weights while another run's weights were parked out of the same model."""
        for p, v in zip(self.params, values):
            p.data = v.to(p.device, copy=True)
        self.resident = True

    def materialize(self, cache: StateCache) -> None:
        """Give the parameters their live shapes again, values undefined, and forget any
        parked state: the run is about to load its state from a checkpoint."""
        if self.key in cache:
            cache.delete(self.key)
        for p, (shape, dtype) in zip(self.params, self._layout):
            if p.shape != shape:  # a placeholder keeps the device the values were on
                p.data = torch.empty(shape, dtype=dtype, device=p.device)
        self.resident = True

    def drop(self, cache: StateCache) -> None:
        """Forget the run's tensors (a failed or deleted run)."""
        if self.key in cache:
            cache.delete(self.key)
        for p in self.params:
            p.data = _placeholder(p.data)
            p.grad = None
        self.resident = False
