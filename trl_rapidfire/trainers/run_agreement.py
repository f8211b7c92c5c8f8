"""What the runs built on one shared model must agree on, and what a warm start cannot change:
the checks a run's build (or a warm clone) makes against the runs before it."""

from __future__ import annotations

from typing import Any

from ..config.configs import RFConfigError
from ..control.ops import OpError

__all__ = ["check_group_agrees", "check_warm_start"]

# Settings a trainer applies to the model or tokenizer it is given, not to itself: runs that
# share a base model (and its tokenizer) must agree on them, or one run's setting would leak
# into the others'.
_SHARED_SETTINGS = ("disable_dropout", "gradient_checkpointing", "activation_checkpointing",
                    "eos_token", "pad_token", "chat_template_path")

# What a warm start cannot change: the adapter's shape.
_SHAPE_FIELDS = ("peft_type", "r", "target_modules", "modules_to_save", "rank_pattern",
                 "use_dora", "layers_to_transform", "trainable_token_indices", "bias")


def check_group_agrees(group: Any, run: str, config: Any) -> None:
    """Raise :class:`RFConfigError` if ``run`` (being built on ``group``'s model) sets a
    shared setting otherwise than the group's first run; the first run records its values."""
    values = {f: getattr(config, f) for f in _SHARED_SETTINGS if hasattr(config, f)}
    first = group.settings
    if first is None:
        group.settings = (run, values)
        return
    other, theirs = first
    for field_name, value in values.items():
        if field_name in theirs and theirs[field_name] != value:
            raise RFConfigError(
                f"{run} sets {field_name}={value!r} but {other}, which shares its base model, "
                f"sets {field_name}={theirs[field_name]!r}. The trainer applies it to the "
                "shared model or tokenizer, so runs of one model must agree: make it a single "
                "value, or give these runs different models."
            )


def check_warm_start(parent: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Raise :class:`OpError` if a warm clone of ``parent`` (its trainer arguments ``before``)
    with the arguments ``after`` could not start from the parent's weights."""
    if after.get("model") is not before.get("model") and after.get("model") != before.get(
        "model"
    ):
        raise OpError(f"warm start from {parent} across a change of base model is not possible; "
                      "use `clone` to train from scratch")
    old, new = before.get("peft_config"), after.get("peft_config")
    if (old is None) != (new is None):
        raise OpError(f"warm start from {parent} between LoRA and full fine-tuning is not "
                      "possible; use `clone`")
    if old is not None:
        changed = [f for f in _SHAPE_FIELDS if getattr(old, f, None) != getattr(new, f, None)]
        if changed:
            raise OpError(f"warm start from {parent}: {changed} change the adapter's shape; "
                          "use `clone` to train it from scratch")
