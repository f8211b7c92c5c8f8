"""The synthetic language every offline test speaks: short arithmetic, counting and copy
questions with one-word answers, drawn from a seed (the tiny tokenizer's corpus and every
dataset of :mod:`.datasets` come from it)."""

from __future__ import annotations

import random
from typing import NamedTuple

__all__ = ["SYSTEM_PROMPT", "Problem", "make_problem", "problems", "wrong_answer"]

SYSTEM_PROMPT = "You are a careful assistant. Answer with one word or number."

_WORDS = (
    "apple", "river", "stone", "cloud", "green", "table",
    "music", "light", "horse", "paper", "sugar", "window",
)  # fmt: skip



class Problem(NamedTuple):
    """One question and its answer."""

    question: str
    answer: str


def make_problem(rng: random.Random) -> Problem:
    task = rng.randrange(4)
    a, b = rng.randrange(10), rng.randrange(10)
    if task == 0:
        return Problem(f"What is {a} plus {b}?", str(a + b))
    if task == 1:
        high, low = max(a, b), min(a, b)
        return Problem(f"What is {high} minus {low}?", str(high - low))
    if task == 2:
        return Problem(f"What comes after {a}?", str(a + 1))
    word = rng.choice(_WORDS)
    return Problem(f"Repeat the word {word}.", word)


def problems(n: int, seed: int) -> list[Problem]:
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(n)]


def wrong_answer(answer: str, rng: random.Random) -> str:
    if answer.isdigit():
        candidates = [str(v) for v in range(int(answer) - 3, int(answer) + 4) if v >= 0]
    else:
        candidates = list(_WORDS)
    return rng.choice([c for c in candidates if c != answer])
