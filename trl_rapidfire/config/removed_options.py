"""Options TRL removed or renamed since the seed's examples were written, and what to say about
each: the RF configs still accept them as fields so that old configs get a message naming the
replacement instead of TRL's bare "unexpected keyword"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DPO_REMOVED", "GRPO_REMOVED", "Removed"]


@dataclass(frozen=True)
class Removed:
    """An option that no longer exists in TRL. ``harmless`` values mean what TRL now does anyway
    (accepted with a warning); any other value is an error, since ignoring it would change the
    training silently."""

    message: str
    harmless: tuple[Any, ...] = (None,)


DPO_REMOVED = {
    "max_prompt_length": Removed(
        "DPOConfig no longer has `max_prompt_length`: TRL 1.x truncates the whole "
        "prompt+completion sequence to `max_length` (see `truncation_mode`). Remove it and set "
        "`max_length`."
    ),
    "max_completion_length": Removed(
        "DPOConfig no longer has `max_completion_length`: TRL 1.x truncates the whole "
        "prompt+completion sequence to `max_length`. Remove it and set `max_length`."
    ),
    "model_adapter_name": Removed(
        "DPOConfig no longer has `model_adapter_name`: the trainer trains the model's active "
        "adapter (PEFT's 'default'). Remove it.",
        harmless=(None, "default"),
    ),
    "ref_adapter_name": Removed(
        "DPOConfig no longer has `ref_adapter_name`: with PEFT and no `ref_model`, the reference "
        "is the base model with the adapter disabled. Remove it, or pass `ref_model=` to the "
        "trainer."
    ),
    "force_use_ref_model": Removed(
        "DPOConfig no longer has `force_use_ref_model`: pass `ref_model=` to the trainer to use an "
        "explicit reference model. Remove it.",
        harmless=(None, False),
    ),
}

GRPO_REMOVED = {
    "max_prompt_length": Removed(
        "GRPOConfig no longer has `max_prompt_length`: TRL 1.x does not truncate prompts. "
        "Remove it and shorten prompts in the dataset if needed (`max_completion_length` still "
        "exists)."
    ),
}
