"""Reward functions for TRL's online trainers (GRPO, RLOO) on the synthetic questions."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["reward_correct_answer", "reward_short"]

_SHORT_CAP_CHARS = 32


def _completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)


def reward_correct_answer(
    completions: Sequence[str | Sequence[dict[str, Any]]], answer: Sequence[str], **kwargs: Any
) -> list[float]:
    """TRL reward function: 1.0 where the completion contains its answer as a whole word, else 0.0.

    Whole-word matching keeps ``"17"`` from counting as a correct ``"7"``. Completions may be
    strings (plain prompts) or lists of message dicts (conversational prompts).
    """
    return [
        1.0 if re.search(rf"\b{re.escape(ans)}\b", _completion_text(completion)) else 0.0
        for completion, ans in zip(completions, answer, strict=True)
    ]


def reward_short(
    completions: Sequence[str | Sequence[dict[str, Any]]], **kwargs: Any
) -> list[float]:
    """TRL reward function preferring short completions: ``1 - chars / 32``, clipped to [0, 1]."""
    return [
        min(1.0, max(0.0, 1.0 - len(_completion_text(c).strip()) / _SHORT_CAP_CHARS))
        for c in completions
    ]
