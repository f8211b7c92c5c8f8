"""The one table of the fields trl-rapidfire adds to TRL's configs, and of the fields that
describe the experiment rather than one run.

Every rule about these fields reads this table: the RF configs take the RF-only ones out
before a run's TRL config is built and refuse a knob on an experiment-wide one, and a clone op
refuses to change what a clone keeps.
"""

from __future__ import annotations

__all__ = ["CHUNK", "CLONE_KEEPS", "EXPERIMENT_WIDE", "RF_ONLY"]

CHUNK = "chunk"
"""The trl-rapidfire value of ``eval_strategy``/``save_strategy``: act at every chunk end."""

RF_ONLY = frozenset({"num_chunks", "warmup_ratio", "cache_budget_bytes", "clone_overrides",
                     "checkpoint_every"})
"""Fields of the RF configs that TRL's configs do not have (``warmup_ratio``: transformers 5
removed it; the RF configs still read it, see :mod:`.removed_options`)."""

EXPERIMENT_WIDE = frozenset({"output_dir", "num_chunks", "cache_budget_bytes", "clone_overrides",
                             "checkpoint_every"})
"""Fields that describe the whole experiment: one value for every run (never a knob), and no
clone may change them (one folder, one chunk plan, one cache, one cadence)."""

CLONE_KEEPS = EXPERIMENT_WIDE | {"report_to"}
"""Fields a clone keeps from the experiment: the experiment-wide ones, and ``report_to`` (a
knob may give runs different integrations, but a clone's metrics go where its parent's do: the
experiment's tracker)."""
