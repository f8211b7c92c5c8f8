"""SuccessiveHalving: asynchronous successive halving (ASHA) over chunk boundaries."""

from __future__ import annotations

import math

from .base import Context, Decision, Policy, check_metric, check_mode, metric_at


class SuccessiveHalving(Policy):
    """Asynchronous successive halving (ASHA) over chunks.

    Rungs are at ``min_chunks * eta**k`` chunks (k = 0, 1, ...). A run at a rung continues
    only if it is among the best ``1/eta`` of the runs at that rung. Nobody waits for slower
    runs, so it works with many workers and with clones added mid-flight:

    * the rung's size counts the runs that reached it *and* those that still can (runs in the
      rotation with fewer chunks), so a run is stopped only once enough runs that are strictly
      better have already arrived: it never stops a run that synchronous successive halving
      over the same runs would keep;
    * a run that waits at a rung (it has not started its next chunk) is judged again whenever
      another run arrives there. With the scheduler's least-progress-first rule every run
      waits at a rung until the others caught up, so on one worker the survivors are exactly
      synchronous successive halving's; a run that moved on before the last arrivals keeps
      its place (ASHA's rule: promotions are never taken back).

    Defined cases: a run with no value of ``metric`` at its rung yet continues (it is judged
    at its next rung); a NaN value fails the run, with the reason; runs tied at the cut-off all
    continue; deleted runs do not count; a run's last chunk is no rung (nothing left to save).

    Args:
        metric: a logged metric (``eval_loss``, ``loss``, ...; ``x`` also finds ``eval_x``).
        mode: ``min`` or ``max``.
        eta: the halving rate (>= 2).
        min_chunks: chunks before the first rung (>= 1).
    """

    def __init__(self, metric: str = "eval_loss", mode: str = "min", eta: int = 2,
                 min_chunks: int = 1) -> None:
        check_metric(metric)
        check_mode(mode)
        if not isinstance(eta, int) or eta < 2:
            raise ValueError(f"eta must be an integer >= 2, got {eta!r}")
        if not isinstance(min_chunks, int) or min_chunks < 1:
            raise ValueError(f"min_chunks must be an integer >= 1, got {min_chunks!r}")
        self.metric, self.mode, self.eta, self.min_chunks = metric, mode, eta, min_chunks

    def rung_of(self, chunks: int) -> int | None:
        """The rung index ``k`` if ``chunks`` is a rung, else ``None``."""
        if chunks < self.min_chunks or chunks % self.min_chunks:
            return None
        ratio, k = chunks // self.min_chunks, 0
        while ratio % self.eta == 0:
            ratio //= self.eta
            k += 1
        return k if ratio == 1 else None

    def evaluates_at(self, run: str, chunks: int, chunks_total: int) -> bool:
        # Judged at its rungs only (a run's last chunk is no rung: the engine evaluates it).
        return chunks < chunks_total and self.rung_of(chunks) is not None

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        me = context.runs[run]
        chunks = me.chunks_done
        rung = self.rung_of(chunks)
        if rung is None:
            return []
        # The rung's runs, indexed by the context and kept up to date as runs move: a
        # decision is O(log N), not a pass over every run's history.
        at = context.rung(self.metric, chunks, self.mode)
        size = at.arrived + at.to_come
        keep = max(1, size // self.eta)
        out = []
        mine = metric_at(me, self.metric, chunks)
        if (mine is not None and math.isnan(mine) and me.status.schedulable
                and not me.training and chunks < me.chunks_total):
            out.append(Decision(run, "fail", f"{self.metric} is NaN at rung {rung} "
                                             f"({chunks} chunks)"))
        # The run that just arrived first, then the ones waiting at the same rung: those with
        # at least ``keep`` arrived runs strictly better are out.
        beaten = at.beaten_waiting(keep)
        for name in sorted(beaten, key=lambda n: n != run):
            value = at.value_of(name)
            assert value is not None  # a waiting run has a value
            out.append(Decision(name, "stop", (
                f"rung {rung}: {self.metric} {value:.4g} not in best 1/{self.eta} of "
                f"{size} ({at.better_than(value)} better)")))
        return out
