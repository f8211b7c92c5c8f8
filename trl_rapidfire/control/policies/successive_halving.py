"""SuccessiveHalving: asynchronous successive halving (ASHA) over chunk boundaries."""

from __future__ import annotations

import math

from .base import Context, Decision, Policy, check_metric, check_mode, metric_at, values_at


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
        chunks = context.runs[run].chunks_done
        rung = self.rung_of(chunks)
        if rung is None:
            return []
        peers = values_at(context, self.metric, chunks)
        to_come = sum(1 for h in context.runs.values()
                      if h.status.schedulable and h.chunks_done < chunks <= h.chunks_total)
        size = len(peers) + to_come
        keep = max(1, size // self.eta)
        out = []
        # The run that just arrived first, then the ones waiting at the same rung.
        waiting = sorted((h for h in context.runs.values() if h.chunks_done == chunks),
                         key=lambda h: h.name != run)
        for h in waiting:
            if not h.status.schedulable or h.training or chunks >= h.chunks_total:
                continue
            mine = metric_at(h, self.metric, chunks)
            if mine is None:
                continue
            if math.isnan(mine):
                if h.name == run:  # a waiting run's NaN was decided when it arrived
                    out.append(Decision(run, "fail", f"{self.metric} is NaN at rung {rung} "
                                                     f"({chunks} chunks)"))
                continue
            better = sum(1 for v in peers.values()
                         if (v < mine if self.mode == "min" else v > mine))
            if better >= keep:
                out.append(Decision(h.name, "stop", (
                    f"rung {rung}: {self.metric} {mine:.4g} not in best 1/{self.eta} of "
                    f"{size} ({better} better)")))
        return out
