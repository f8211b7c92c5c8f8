"""An FSDP run's config: ``fsdp_config`` keys of older transformers mapped onto current ones,
and the TRL config of a run that a gang of workers trains, built in the launch's world."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Any

from ..runtime.accelerate_state import (
    World,
    building_in,
    fsdp_on_cpu_installed,
    left_as_found,
    preserved_accelerate_state,
)
from ..runtime.workers import current_worker
from .errors import RFConfigError

__all__ = ["gang_config", "is_gang_config", "normalize_fsdp_config"]

_FSDP_RENAMED = {"offload_params": "cpu_offload"}
_FSDP_KNOWN = frozenset(
    {
        "version", "cpu_offload", "auto_wrap_policy", "min_num_params",
        "transformer_layer_cls_to_wrap", "cpu_ram_efficient_loading", "state_dict_type",
        "activation_checkpointing", "reshard_after_forward", "xla", "xla_fsdp_settings",
        "xla_fsdp_grad_ckpt", "xla_fsdp_v2",
    }
)
_FSDP1_ONLY = frozenset(
    {"forward_prefetch", "backward_prefetch", "use_orig_params", "sync_module_states",
     "limit_all_gathers"}
)
_FSDP2_SHARDING = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}


def normalize_fsdp_config(fsdp_config: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``fsdp_config`` keys from older transformers onto current ones, loudly.

    transformers 5 silently ignores keys it does not read. Here a renamed key is mapped with a
    warning (``offload_params`` -> ``cpu_offload``), ``sharding_strategy`` becomes FSDP2's
    ``reshard_after_forward``, FSDP1-only keys under FSDP2 and unknown keys are warned about, and
    contradictions (both spellings, different values) are errors. Never drops an offload setting.
    """
    cfg = {(k[5:] if k.startswith("fsdp_") else k): v for k, v in fsdp_config.items()}
    version = int(cfg.get("version", 2))
    for old, new in _FSDP_RENAMED.items():
        if old in cfg:
            value = cfg.pop(old)
            if new in cfg and cfg[new] != value:
                raise RFConfigError(
                    f"fsdp_config sets both `{old}`={value!r} and `{new}`={cfg[new]!r}; `{old}` is "
                    f"the old name of `{new}`. Keep only `{new}`."
                )
            warnings.warn(
                f"fsdp_config key `{old}` was renamed `{new}` in transformers 5; using "
                f"{new}={value!r}.",
                FutureWarning,
                stacklevel=4,
            )
            cfg[new] = value
    if "sharding_strategy" in cfg:
        strategy = str(cfg.pop("sharding_strategy")).upper()
        if version == 2:
            if strategy not in _FSDP2_SHARDING:
                raise RFConfigError(
                    f"fsdp_config sharding_strategy={strategy!r} exists only in FSDP1; FSDP2 (the "
                    "default, `version: 2`) supports FULL_SHARD and SHARD_GRAD_OP via "
                    "`reshard_after_forward`."
                )
            mapped = _FSDP2_SHARDING[strategy]
            if "reshard_after_forward" in cfg and cfg["reshard_after_forward"] != mapped:
                raise RFConfigError(
                    f"fsdp_config sharding_strategy={strategy!r} contradicts "
                    f"reshard_after_forward={cfg['reshard_after_forward']!r}. Keep one."
                )
            cfg["reshard_after_forward"] = mapped
        else:
            cfg.setdefault("reshard_after_forward", strategy.lower())
    if version == 2:
        ignored = sorted(set(cfg) & _FSDP1_ONLY)
        if ignored:
            warnings.warn(
                f"fsdp_config keys {ignored} only affect FSDP1; with FSDP2 (the default) they have "
                "no effect.",
                UserWarning,
                stacklevel=4,
            )
    unknown = sorted(set(cfg) - _FSDP_KNOWN - _FSDP1_ONLY)
    if unknown:
        warnings.warn(
            f"fsdp_config keys {unknown} are not read by transformers and have no effect.",
            UserWarning,
            stacklevel=4,
        )
    return cfg


def is_gang_config(config: Any) -> bool:
    """Whether a concrete config's run is trained by a gang of workers (it sets ``fsdp``)."""
    return bool(getattr(config, "fsdp", None))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def validating_world(kwargs: dict[str, Any]) -> contextlib.AbstractContextManager[object]:
    """Where an RF config checks a candidate's values with TRL's ``__post_init__``: an FSDP
    candidate under a launch in the launch's world, as its run's config is built
    (:func:`gang_config`); anything else in this worker's world. Accelerate's state is left
    as it was either way."""
    if kwargs.get("fsdp") and current_worker().launched:
        stack = contextlib.ExitStack()
        stack.enter_context(left_as_found())
        stack.enter_context(building_in(World.LAUNCH))
        return stack
    return preserved_accelerate_state()


def gang_config(parent: type, kwargs: dict[str, Any]) -> Any:
    """Build an FSDP run's TRL config. Under a launch it is built in the launch's world (the
    run is trained by all workers as one distributed job), leaving the process's accelerate
    state as it was; outside one it is built as any config (to inspect or validate it: the
    trainer refuses to train it)."""
    if current_worker().launched and not _cuda():
        if kwargs.get("ddp_backend") is None:
            kwargs["ddp_backend"] = "gloo"  # the only process group a CPU machine has
        if not fsdp_on_cpu_installed():
            fsdp_config = kwargs.get("fsdp_config") or {}
            offload = " (cpu_offload included)" if isinstance(fsdp_config, dict) and (
                fsdp_config.get("cpu_offload") or fsdp_config.get("offload_params")) else ""
            warnings.warn(
                "No GPU: accelerate selects FSDP only on GPUs. As with plain TRL, on this "
                "machine an FSDP run trains data-parallel over the launch (fsdp_config has no "
                f"effect{offload}) when it sets use_cpu=True; without it TRL refuses it "
                "('Using fsdp only works in distributed training').", UserWarning, stacklevel=4)
    with validating_world(kwargs):  # built in the world its values are checked in
        return parent(**kwargs)
