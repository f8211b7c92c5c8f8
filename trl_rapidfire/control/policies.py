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
:class:`PopulationBased` (exploit and explore with warm clones) and :class:`Budget`; combine
several by passing a list (:class:`Policies`).
"""

from __future__ import annotations

import hashlib
import math
import random
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..config.knobs import Knob
from ..shared_state.runs import RunStatus

__all__ = [
    "Budget",
    "Context",
    "Decision",
    "Policies",
    "Policy",
    "PopulationBased",
    "RunHistory",
    "SuccessiveHalving",
    "chunk_values",
    "metric_at",
]


@dataclass(frozen=True)
class RunHistory:
    """What a policy knows of one run.

    Attributes:
        name: the run's name.
        status: its status now.
        chunks_done: chunks trained so far.
        chunks_total: chunks in its plan.
        chunk_ends: the global step at the end of each chunk of its plan, in order.
        log: the run's logged entries (``trainer.state.log_history``: dicts with ``step``).
        knobs: its knob values.
        parent: the run it was cloned from, if any.
        training: a worker is training its next chunk right now (it has left its last
            boundary: a decision about that boundary comes too late to save the chunk).
    """

    name: str
    status: RunStatus
    chunks_done: int
    chunks_total: int
    chunk_ends: tuple[int, ...]
    log: tuple[Mapping[str, Any], ...] = ()
    knobs: Mapping[str, Any] = field(default_factory=dict)
    parent: str | None = None
    training: bool = False


@dataclass(frozen=True)
class Context:
    """Everything a policy sees at a chunk end.

    Attributes:
        runs: every run of the experiment by name (clones included, as they appear).
        wall_seconds: time the experiment has trained so far, over all its sessions.
    """

    runs: Mapping[str, RunHistory]
    wall_seconds: float = 0.0

    @property
    def total_steps(self) -> int:
        """Optimizer steps trained so far, summed over every run."""
        return sum(
            h.chunk_ends[h.chunks_done - 1] if 0 < h.chunks_done <= len(h.chunk_ends) else 0
            for h in self.runs.values()
        )


@dataclass(frozen=True)
class Decision:
    """One automatic control op.

    Attributes:
        run: the run it applies to (for ``clone``: the parent).
        action: ``stop`` (resumable), ``fail`` (with the reason), or ``clone``.
        reason: why, as it should read in the op log (``by <policy>`` is added).
        overrides: for ``clone``, the knob overrides.
        warm: for ``clone``, start from the parent's weights.
        by: the policy that decided (filled in by :class:`Policies`; empty: the policy
            asked).
    """

    run: str
    action: Literal["stop", "fail", "clone"]
    reason: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    warm: bool = False
    by: str = ""


class Policy(ABC):
    """Asked at every chunk end; returns the decisions to carry out (none: all continue)."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def metrics(self) -> tuple[str, ...]:
        """The logged metrics this policy judges runs by (its ``metric``, if it has one): an
        ``eval_*`` one needs every run to evaluate, which is checked before anything trains."""
        metric = getattr(self, "metric", None)
        return (metric,) if isinstance(metric, str) else ()

    @abstractmethod
    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        """``run`` has just finished a chunk; ``context`` shows every run as of now."""

    def admits_new_runs(self, context: Context) -> bool:
        """Whether an adaptive search may start another run now (a spent :class:`Budget`
        says no: the runs it stopped would otherwise be replaced, one chunk each)."""
        return True


class Policies(Policy):
    """Several policies asked in order; each run gets at most one stop or fail (the first).
    Clones are not decisions about their parent: all of them are kept."""

    def __init__(self, policies: Iterable[Policy]) -> None:
        self.policies = list(policies)
        for p in self.policies:
            if not isinstance(p, Policy):
                raise TypeError(f"{p!r} is not a Policy (SuccessiveHalving, Budget, ...)")

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        decided: dict[str, Decision] = {}
        out = []
        for policy in self.policies:
            for d in policy.on_chunk_end(run, context):
                # The op log names the policy that decided, not this combination.
                d = replace(d, by=d.by or policy.name)
                if d.action != "clone":
                    if d.run in decided:
                        continue
                    decided[d.run] = d
                out.append(d)
        return out

    def admits_new_runs(self, context: Context) -> bool:
        return all(p.admits_new_runs(context) for p in self.policies)

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m for p in self.policies for m in p.metrics))


def metric_at(history: RunHistory, metric: str, chunks: int) -> float | None:
    """The last value of ``metric`` (or ``eval_<metric>``) the run logged by the end of its
    chunk number ``chunks`` (1-based); ``None`` if it logged none by then. NaN is returned
    as NaN: the caller decides what it means."""
    if chunks <= 0 or chunks > len(history.chunk_ends):
        return None
    end = history.chunk_ends[chunks - 1]
    keys = (metric,) if metric.startswith("eval_") else (metric, f"eval_{metric}")
    value = None
    for entry in history.log:
        if entry.get("step", math.inf) > end:
            continue
        for key in keys:
            v = entry.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                value = float(v)
                break
    return value


def chunk_values(history: RunHistory, metric: str) -> dict[int, float]:
    """Step at the end of each finished chunk -> the last value of ``metric`` (or
    ``eval_<metric>``) logged within that chunk; chunks without one are left out, NaN kept.
    What Optuna calls a trial's intermediate values (the search and the pruner report them)."""
    ends = history.chunk_ends[:max(history.chunks_done, 0)]
    keys = (metric,) if metric.startswith("eval_") else (metric, f"eval_{metric}")
    out: dict[int, float] = {}
    for entry in history.log:
        step = entry.get("step")
        if not isinstance(step, (int, float)) or isinstance(step, bool) or step <= 0:
            continue
        chunk = bisect_left(ends, step)  # the first chunk whose end is at or after the step
        if chunk == len(ends):
            continue
        for key in keys:
            value = entry.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[ends[chunk]] = float(value)
                break
    return out


def _check_mode(mode: str) -> None:
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")


def check_metric(metric: Any) -> None:
    """A policy's metric is the name of a logged value (``eval_loss``, ``loss``, ...)."""
    if not isinstance(metric, str) or not metric.strip():
        raise ValueError(f"metric must name a logged value such as 'eval_loss' or 'loss', got "
                         f"{metric!r}")


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
        _check_mode(mode)
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

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        chunks = context.runs[run].chunks_done
        rung = self.rung_of(chunks)
        if rung is None:
            return []
        peers = _values_at(context, self.metric, chunks)
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


def _values_at(context: Context, metric: str, chunks: int) -> dict[str, float]:
    """Each run's value of ``metric`` at ``chunks`` chunks, for the runs that got there (NaN
    and missing values left out; deleted runs do not count)."""
    out = {}
    for other in context.runs.values():
        if other.status == RunStatus.DELETED or other.chunks_done < chunks:
            continue
        value = metric_at(other, metric, chunks)
        if value is not None and not math.isnan(value):
            out[other.name] = value
    return out


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
        _check_mode(mode)
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
        values = _values_at(context, self.metric, chunks)
        if len(values) < 2:
            return []
        cut = max(1, int(len(values) * self.quantile))
        ordered = sorted(values.items(), key=lambda kv: kv[1], reverse=self.mode == "min")
        # Replaced: strictly worse than the worst run outside the bottom quantile (so runs
        # tied with it stay, and never more than the quantile goes).
        boundary = ordered[cut][1]
        if not ((mine > boundary) if self.mode == "min" else (mine < boundary)):
            return []
        top = [name for name, _ in ordered[-cut:] if name != run]
        if not top:
            return []
        rng = self._rng(run, chunks)
        donor = top[rng.randrange(len(top))]
        overrides = self._mutate(context.runs[donor].knobs, rng)
        reason = (f"{self.metric} {mine:.4g} in the bottom {self.quantile:g} of "
                  f"{len(values)} after {chunks} chunks")
        return [Decision(run, "stop", reason),
                Decision(donor, "clone", f"replaces {run} ({reason})", overrides, warm=True)]


class Budget(Policy):
    """Stops every remaining run (resumably) once the experiment has spent its budget.

    Args:
        max_wall_seconds: training time, over all sessions of the experiment.
        max_total_steps: optimizer steps, summed over every run.
    """

    def __init__(self, max_wall_seconds: float | None = None,
                 max_total_steps: int | None = None) -> None:
        if max_wall_seconds is None and max_total_steps is None:
            raise ValueError("Budget needs max_wall_seconds and/or max_total_steps")
        for name, value in (("max_wall_seconds", max_wall_seconds),
                            ("max_total_steps", max_total_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, (int, float)) or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self.max_wall_seconds, self.max_total_steps = max_wall_seconds, max_total_steps

    def spent(self, context: Context) -> str | None:
        """Why the budget is spent, or ``None``."""
        if self.max_wall_seconds is not None and context.wall_seconds >= self.max_wall_seconds:
            return (f"budget spent: {context.wall_seconds:.0f} s of "
                    f"{self.max_wall_seconds:g} s")
        steps = context.total_steps
        if self.max_total_steps is not None and steps >= self.max_total_steps:
            return f"budget spent: {steps} of {self.max_total_steps} steps"
        return None

    def admits_new_runs(self, context: Context) -> bool:
        return self.spent(context) is None

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        reason = self.spent(context)
        if reason is None:
            return []
        return [Decision(h.name, "stop", reason) for h in context.runs.values()
                if h.status.schedulable and h.chunks_done < h.chunks_total]


def as_policy(policy: Policy | Sequence[Policy] | None) -> Policy | None:
    """What the trainers accept as ``policy=``: one policy, a list of them, or ``None``."""
    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, Sequence) and not isinstance(policy, (str, bytes)):
        return Policies(policy)
    raise TypeError(f"policy must be a Policy (SuccessiveHalving(...), Budget(...)) or a list "
                    f"of them, got {policy!r}")
