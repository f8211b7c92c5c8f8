"""PopulationBased: the better runs' warm clones, with mutated knobs, replace the worse."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from typing import Any

from ...config.knobs import Knob
from .base import Context, Decision, Policy, check_metric, check_mode, metric_at


class PopulationBased(Policy):
    """Population-based training at chunk granularity: exploit, then explore.

    Every ``interval_chunks`` chunks of a run, its metric there is compared with the values of
    every run that got as far. A run in the bottom ``quantile`` is stopped and replaced by a
    *warm* clone of a run in the top ``quantile`` (its weights and optimizer state) whose knobs
    are mutated: a ``List``/``Range`` in ``mutations`` draws a new value, a number ``f``
    multiplies the donor's value by ``f`` or ``1/f``. Choices are drawn from a generator seeded
    by ``seed``, the run and the chunk, so they are the same on a re-run.

    Defined cases: fewer than two runs at a point, or a run without the metric yet: nothing
    happens; a NaN value fails the run; ties with the bottom cut-off are kept.

    Args:
        metric, mode: as for :class:`SuccessiveHalving`.
        interval_chunks: chunks between two decisions about a run.
        quantile: the share of runs replaced, and of runs that can donate (0 < q <= 0.5).
        mutations: knob name -> ``List``/``Range`` or a factor (> 1).
        seed: seeds the draws.
    """

    def __init__(self, metric: str = "eval_loss", mode: str = "min", interval_chunks: int = 2,
                 quantile: float = 0.25, mutations: Mapping[str, Any] | None = None,
                 seed: int = 0) -> None:
        check_mode(mode)
        if not isinstance(interval_chunks, int) or interval_chunks < 1:
            raise ValueError(f"interval_chunks must be an integer >= 1, got {interval_chunks!r}")
        if not isinstance(quantile, (int, float)) or not 0 < quantile <= 0.5:
            raise ValueError(f"quantile must be in (0, 0.5], got {quantile!r}")
        if not mutations:
            raise ValueError("PopulationBased needs mutations={knob: List/Range or factor}")
        for knob, spec in mutations.items():
            if not isinstance(spec, Knob) and not (
                isinstance(spec, (int, float)) and not isinstance(spec, bool) and spec > 1
            ):
                raise ValueError(f"mutations[{knob!r}] must be a List, a Range or a factor "
                                 f"> 1, got {spec!r}")
        check_metric(metric)
        self.metric, self.mode, self.interval = metric, mode, interval_chunks
        self.quantile, self.mutations, self.seed = quantile, dict(mutations), seed

    def _rng(self, run: str, chunks: int) -> random.Random:
        digest = hashlib.sha256(f"{self.seed}/{run}/{chunks}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def _mutate(self, knobs: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
        out = {}
        for knob, spec in self.mutations.items():
            if isinstance(spec, Knob):
                out[knob] = spec.sample(rng)
            elif knob in knobs and isinstance(knobs[knob], (int, float)):
                value = knobs[knob] * (spec if rng.random() < 0.5 else 1 / spec)
                out[knob] = type(knobs[knob])(value) if isinstance(knobs[knob], int) else value
        return out

    def evaluates_at(self, run: str, chunks: int, chunks_total: int) -> bool:
        # Exploit points only; a run's last chunk decides nothing (the engine evaluates it).
        return chunks < chunks_total and chunks % self.interval == 0

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        me = context.runs[run]
        chunks = me.chunks_done
        if chunks % self.interval or chunks >= me.chunks_total or not me.status.schedulable:
            return []
        mine = metric_at(me, self.metric, chunks)
        if mine is None:
            return []
        if math.isnan(mine):
            return [Decision(run, "fail", f"{self.metric} is NaN after {chunks} chunks")]
        # The runs at this point ranked by the context's index (kept as runs move), not by a
        # pass over every history: worst first, ties in the runs' order.
        at = context.rung(self.metric, chunks, self.mode)
        if at.arrived < 2:
            return []
        cut = max(1, int(at.arrived * self.quantile))
        # Replaced: strictly worse than the worst run outside the bottom quantile (so runs
        # tied with it stay, and never more than the quantile goes).
        boundary = at.value_at(at.arrived - 1 - cut)
        if not ((mine > boundary) if self.mode == "min" else (mine < boundary)):
            return []
        # The donor: one of the top ``cut``, drawn worst of them first (the run itself, worse
        # than the boundary, is never among them; cut <= arrived / 2). Picked by rank, not
        # from a list of the top runs made at every decision (128 names at 512 runs).
        rng = self._rng(run, chunks)
        donor = at.name_at(cut - 1 - rng.randrange(cut))
        overrides = self._mutate(context.runs[donor].knobs, rng)
        reason = (f"{self.metric} {mine:.4g} in the bottom {self.quantile:g} of "
                  f"{at.arrived} after {chunks} chunks")
        return [Decision(run, "stop", reason),
                Decision(donor, "clone", f"replaces {run} ({reason})", overrides, warm=True,
                         replaces=run)]
