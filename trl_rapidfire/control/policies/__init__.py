"""Automatic control: policies that watch the runs at chunk boundaries and issue control ops.

A policy is asked at every chunk end (of any run) what should happen, and answers with
:class:`Decision`s: stop a run, fail it (its metric is NaN), or clone one with overrides (warm
or cold). "Continue" is the absence of a decision. These are the ops a person can issue (see
:mod:`trl_rapidfire.control.ops`), so every automatic decision lands in the op log and on the run's
tags with its reason, and a person's op on the same run at the same boundary wins.

Policies are *stateless*: every decision is a function of the runs' histories (their logged
metrics and chunk boundaries), which survive a crash in the runs' checkpoints. A re-run, or
another worker, asks the same question and gets the same answer; nothing of a policy needs
saving. The model is Optuna's pruners and Ray Tune's trial schedulers (``on_result ->
CONTINUE | PAUSE | STOP``), asked at chunk granularity.

Built in: :class:`SuccessiveHalving` (asynchronous successive halving, ASHA),
:class:`Hyperband` (several halving schedules side by side, runs split between them),
:class:`PopulationBased` (exploit and explore with warm clones) and :class:`Budget`; combine
several by passing a list (:class:`Policies`).
"""


from .base import (
    Context,
    Decision,
    Policies,
    Policy,
    RunHistory,
    as_policy,
    chunk_values,
    metric_at,
)
from .budget import Budget
from .hyperband import Hyperband
from .population_based import PopulationBased
from .successive_halving import SuccessiveHalving

__all__ = [
    "Budget",
    "Context",
    "Decision",
    "Hyperband",
    "Policies",
    "Policy",
    "PopulationBased",
    "RunHistory",
    "SuccessiveHalving",
    "as_policy",
    "chunk_values",
    "metric_at",
]
