"""Synthetic datasets in the row formats TRL's trainers read, from the questions of
:mod:`.problems` (equal seeds give equal questions across kinds)."""

from __future__ import annotations

import random
from typing import Any, Literal

from datasets import Dataset

from .problems import SYSTEM_PROMPT, wrong_answer
from .problems import problems as draw_problems

__all__ = ["make_dpo_dataset", "make_grpo_dataset", "make_kto_dataset", "make_reward_dataset",
           "make_sft_dataset"]

SftKind = Literal["text", "prompt_completion", "messages"]


def make_sft_dataset(n: int = 64, seed: int = 0, kind: SftKind = "text") -> Dataset:
    """Synthetic SFT data: short arithmetic, counting and copy questions with their answers.

    Args:
        n: Number of rows.
        seed: Equal seeds give equal datasets.
        kind: ``"text"`` gives a ``text`` column (``"What is 3 plus 4? 7"``);
            ``"prompt_completion"`` gives conversational ``prompt`` (one user message) and
            ``completion`` (one assistant message) columns; ``"messages"`` gives a ``messages``
            column holding a system, user, assistant conversation.
    """
    problems = draw_problems(n, seed)
    if kind == "text":
        return Dataset.from_dict({"text": [f"{p.question} {p.answer}" for p in problems]})
    if kind == "prompt_completion":
        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": p.question}] for p in problems],
                "completion": [[{"role": "assistant", "content": p.answer}] for p in problems],
            }
        )
    if kind == "messages":
        return Dataset.from_dict(
            {
                "messages": [
                    [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": p.question},
                        {"role": "assistant", "content": p.answer},
                    ]
                    for p in problems
                ]
            }
        )
    raise ValueError(f"kind must be 'text', 'prompt_completion' or 'messages', got {kind!r}")


def make_dpo_dataset(n: int = 64, seed: int = 0, conversational: bool = False) -> Dataset:
    """Synthetic preference data: ``prompt``, ``chosen`` (right answer), ``rejected`` (wrong one).

    Plain form: ``prompt`` is the question and ``chosen``/``rejected`` start with a space, so
    ``prompt + chosen`` reads like a row of ``make_sft_dataset(kind="text")``. Conversational
    form: ``prompt`` is one user message, ``chosen``/``rejected`` one assistant message each.
    """
    problems = draw_problems(n, seed)
    # A separate stream, so the questions match make_sft_dataset/make_grpo_dataset for a seed.
    wrong_rng = random.Random(f"dpo-rejected-{seed}")
    wrong = [wrong_answer(p.answer, wrong_rng) for p in problems]
    if conversational:
        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": p.question}] for p in problems],
                "chosen": [[{"role": "assistant", "content": p.answer}] for p in problems],
                "rejected": [[{"role": "assistant", "content": w}] for w in wrong],
            }
        )
    return Dataset.from_dict(
        {
            "prompt": [p.question for p in problems],
            "chosen": [f" {p.answer}" for p in problems],
            "rejected": [f" {w}" for w in wrong],
        }
    )


def make_grpo_dataset(n: int = 64, seed: int = 0, conversational: bool = True) -> Dataset:
    """Synthetic RL prompts: ``prompt`` (one user message, or the bare question) and ``answer``.

    ``answer`` is the correct answer as a string; TRL passes it to reward functions as the
    ``answer`` keyword (see :func:`reward_correct_answer`).
    """
    problems = draw_problems(n, seed)
    prompts: list[Any] = (
        [[{"role": "user", "content": p.question}] for p in problems]
        if conversational
        else [p.question for p in problems]
    )
    return Dataset.from_dict({"prompt": prompts, "answer": [p.answer for p in problems]})


def make_kto_dataset(n: int = 64, seed: int = 0, conversational: bool = False) -> Dataset:
    """Synthetic unpaired feedback for KTO: ``prompt``, ``completion`` and ``label`` (``True``:
    a thumbs-up). Every other row answers right (desirable), the rest answer wrong, so both
    kinds are in every batch of two or more.

    Plain form: the question, and the answer with a leading space; conversational form: one
    user message and one assistant message.
    """
    rows = draw_problems(n, seed)
    wrong_rng = random.Random(f"kto-undesirable-{seed}")
    labels = [i % 2 == 0 for i in range(n)]
    answers = [p.answer if good else wrong_answer(p.answer, wrong_rng)
               for p, good in zip(rows, labels)]
    if conversational:
        return Dataset.from_dict({
            "prompt": [[{"role": "user", "content": p.question}] for p in rows],
            "completion": [[{"role": "assistant", "content": a}] for a in answers],
            "label": labels,
        })
    return Dataset.from_dict({"prompt": [p.question for p in rows],
                              "completion": [f" {a}" for a in answers], "label": labels})


def make_reward_dataset(n: int = 64, seed: int = 0, conversational: bool = False) -> Dataset:
    """Synthetic preference pairs for a reward model, prompt implicit: ``chosen`` (the question
    and its right answer) and ``rejected`` (the same question, a wrong answer); the pairs of
    :func:`make_dpo_dataset` with the prompt in each answer. Conversational form: a user and
    an assistant message each."""
    pairs = make_dpo_dataset(n, seed, conversational=conversational)
    if conversational:
        return Dataset.from_dict({
            side: [prompt + answer for prompt, answer in zip(pairs["prompt"], pairs[side])]
            for side in ("chosen", "rejected")
        })
    return Dataset.from_dict({side: [prompt + answer for prompt, answer
                                     in zip(pairs["prompt"], pairs[side])]
                              for side in ("chosen", "rejected")})
