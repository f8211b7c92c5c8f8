"""How large one run's chunk plan may be, and the fields that size it.

A run's plan lists every chunk of every epoch (:mod:`trl_rapidfire.engine.chunks`), the shared
state keeps a record per chunk, and the policies read the chunk ends. A value that sizes the
plan absurdly (``num_train_epochs=1e9`` from a clone tag, ``max_steps=10**12``) would make
building it take minutes and gigabytes on the training thread, and every other run and op
would wait behind it. So these values are checked against the limits below, with a message
that names the field, the limit and the fix: when a config is made (every candidate of a
knob included), when a clone op is checked (before anything of the clone is built), and, for
what only the dataset decides, when the plan is counted (before it is built).

The limits are far above any real fine-tuning run, and far below what a machine cannot hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import RFConfigError
from .knobs import List, Range

__all__ = ["MAX_NUM_CHUNKS", "MAX_PLAN_CHUNKS", "MAX_TRAIN_EPOCHS", "MAX_TRAIN_STEPS",
           "PLAN_FIELDS", "check_plan_fields", "plan_field_problem"]

MAX_NUM_CHUNKS = 10_000
"""``num_chunks``: the chunks each epoch of a run is cut into (runs switch at each one)."""

MAX_TRAIN_EPOCHS = 100_000
"""``num_train_epochs``: every epoch is at least one chunk of the plan."""

MAX_TRAIN_STEPS = 100_000_000
"""``max_steps``, and a run's optimizer steps however they are reached (epochs times the
steps of an epoch)."""

MAX_PLAN_CHUNKS = 100_000
"""The chunks of one run's whole plan (``num_chunks`` times its epochs, as its dataset
makes them)."""

# Field -> (its limit, the limit's name, what to do instead).
PLAN_FIELDS: dict[str, tuple[int, str, str]] = {
    "num_train_epochs": (MAX_TRAIN_EPOCHS, "MAX_TRAIN_EPOCHS",
                         "train fewer epochs, or bound the run with max_steps"),
    "max_steps": (MAX_TRAIN_STEPS, "MAX_TRAIN_STEPS",
                  "give a step count a run can reach, or -1 to train num_train_epochs"),
    "num_chunks": (MAX_NUM_CHUNKS, "MAX_NUM_CHUNKS",
                   "cut each epoch into fewer chunks (e.g. num_chunks=4)"),
}
"""The fields that size a run's plan, each with its limit."""


def plan_field_problem(name: str, value: Any) -> str | None:
    """Why ``value`` of the plan-sizing field ``name`` is over its limit, or ``None`` (also
    for a field that does not size the plan, or a value of a type other checks refuse)."""
    spec = PLAN_FIELDS.get(name)
    if spec is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    limit, constant, fix = spec
    if math.isnan(value) or value <= limit:
        return None  # NaN and negative values are the type and range checks' to refuse
    shown = f"{value:g}" if isinstance(value, float) else f"{value:,}"
    return (f"`{name}`={shown} is over its limit of {limit:,} ({constant} in "
            f"trl_rapidfire.config.plan_limits): a run's chunk plan lists every chunk it "
            f"trains, and one this large would stall the whole experiment; {fix}")


def check_plan_fields(values: Mapping[str, Any]) -> None:
    """:class:`RFConfigError` for the first plan-sizing field in ``values`` over its limit;
    a knob's every candidate (a ``Range``: its bounds) is checked."""
    for name in PLAN_FIELDS:
        value = values.get(name)
        if isinstance(value, List):
            candidates = list(value.values)
        elif isinstance(value, Range):
            candidates = [value.low, value.high]
        else:
            candidates = [value]
        for candidate in candidates:
            problem = plan_field_problem(name, candidate)
            if problem is not None:
                raise RFConfigError(problem + ".")
