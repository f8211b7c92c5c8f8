"""Hyperband: several successive-halving schedules over chunks, side by side."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import replace

from ...storage.layout import run_index
from .base import Context, Decision, Policy, RunHistory, check_metric, check_mode
from .successive_halving import SuccessiveHalving

# More brackets than this would need a run to train eta**32 chunks before its first rung.
_MAX_BRACKETS = 32


class Hyperband(Policy):
    """Hyperband over chunks: the runs are split into brackets, each bracket halved on its
    own schedule, so a config that needs many chunks before its metric ranks it still gets a
    fair chance in the brackets that judge late.

    **Brackets.** Bracket ``b`` (0, 1, ...) has its first rung at ``min_chunks * eta**b``
    chunks and its further rungs ``eta`` times apart; a run's last chunk is never a rung.
    Bracket 0 is the most aggressive (it is ``SuccessiveHalving(eta=eta,
    min_chunks=min_chunks)``); the last one may have no rung before the end, and its runs are
    then never stopped: that is Hyperband's hedge. With ``brackets=None`` there are
    ``s_max + 1`` brackets, ``s_max = floor(log_eta(R / min_chunks))`` where ``R`` is the
    run's chunk count.

    **Which bracket a run is in.** It is decided from the run's name alone (and its chunk
    count, which sets the number of brackets), so a re-run, another worker, or a clone made
    mid-flight gets the same answer. With ``S`` brackets, bracket ``b`` takes
    ``n_b = ceil(S * eta**(S-1-b) / (S-b))`` places of each cycle of ``T = sum(n_b)`` places:
    Li et al.'s number of configs for the bracket, chosen so every bracket spends about the
    same chunks, so the aggressive brackets get the most runs. Within a cycle, the ``k``-th
    place of bracket ``b`` lies at ``(2k+1) / (2 n_b)`` of the cycle (places in that order,
    ties to the smaller bracket), which spreads each bracket evenly over consecutive runs;
    ``run-<i>`` takes place ``i mod T``, any other name place ``crc32(name) mod T``. For
    ``eta=2`` and 8 chunks (4 brackets, shares 8, 6, 4, 4 of 22), 64 runs split 23, 17, 12, 12.

    **Within a bracket** the rule is exactly :class:`SuccessiveHalving`'s over the runs of
    that bracket only (runs still to come counted, waiting runs judged again, NaN fails, ties
    kept, deleted runs not counted). A run is never compared with another bracket's runs.

    This is for grid and random search. With an Optuna sampler, Optuna's own
    ``OptunaPruner(optuna.pruners.HyperbandPruner(...))`` is the counterpart; it draws a
    trial's bracket from a hash of the study name and trial number (the shares then hold only
    on average) and its halving decides on arrival, without counting the runs still to come.

    Args:
        metric: a logged metric (``eval_loss``, ``loss``, ...; ``x`` also finds ``eval_x``).
        mode: ``min`` or ``max``.
        eta: the halving rate (>= 2). The default 2 suits this package's few chunks a run
            (4 to 16): it gives ``log2(R) + 1`` brackets, and for a power-of-two chunk count
            the last one has no rung before the end (with 3, 8 or 16 chunks give 2 or 3
            brackets that all stop runs).
        min_chunks: the grace period: chunks before bracket 0's first rung (>= 1).
        brackets: how many brackets (>= 1), counted from the most aggressive; ``None``: all
            of them for each run's chunk count. ``1`` is plain successive halving.
    """

    def __init__(self, metric: str = "eval_loss", mode: str = "min", eta: int = 2,
                 min_chunks: int = 1, brackets: int | None = None) -> None:
        check_metric(metric)
        check_mode(mode)
        if not _is_int(eta) or eta < 2:
            raise ValueError(f"eta must be an integer >= 2 (2 keeps the best half at each "
                             f"rung, 3 the best third), got {eta!r}")
        if not _is_int(min_chunks) or min_chunks < 1:
            raise ValueError(f"min_chunks must be an integer >= 1 (the chunks before the "
                             f"first rung of bracket 0), got {min_chunks!r}")
        if brackets is not None and (not _is_int(brackets)
                                     or not 1 <= brackets <= _MAX_BRACKETS):
            raise ValueError(f"brackets must be None (all of them) or an integer from 1 to "
                             f"{_MAX_BRACKETS}, got {brackets!r}")
        self.metric, self.mode, self.eta, self.min_chunks = metric, mode, eta, min_chunks
        self.brackets = brackets
        # Caches of pure functions of the arguments: decisions still depend on the runs'
        # histories alone.
        self._halving: dict[int, SuccessiveHalving] = {}
        self._of: dict[tuple[str, int], int] = {}
        # Each bracket's view of the context last asked with (see _views_of).
        self._source: Context | None = None
        self._synced = 0
        self._views: dict[int, Context] = {}
        self._placed: dict[str, int] = {}

    def bracket_count(self, chunks_total: int) -> int:
        """How many brackets a run of ``chunks_total`` chunks is spread over."""
        if self.brackets is not None:
            return self.brackets
        count, first = 1, self.min_chunks * self.eta
        while first <= chunks_total and count < _MAX_BRACKETS:
            count, first = count + 1, first * self.eta
        return count

    def bracket_of(self, run: str, chunks_total: int) -> int:
        """The bracket of run ``run`` (with ``chunks_total`` chunks in its plan)."""
        key = (run, chunks_total)
        if key not in self._of:
            shares = _shares(self.eta, self.bracket_count(chunks_total))
            index = run_index(run)
            # crc32, not hash(): Python salts str hashes per process.
            place = index if index is not None else zlib.crc32(run.encode("utf-8"))
            self._of[key] = _bracket_at(shares, place % sum(shares))
        return self._of[key]

    def brackets_of(self, names: Iterable[str], chunks_total: int) -> dict[int, list[str]]:
        """Bracket -> the runs of ``names`` in it (every bracket listed, empty ones too)."""
        out: dict[int, list[str]] = {b: [] for b in range(self.bracket_count(chunks_total))}
        for name in names:
            out[self.bracket_of(name, chunks_total)].append(name)
        return out

    def rungs(self, bracket: int, chunks_total: int) -> list[int]:
        """The chunk counts at which runs of ``bracket`` are judged (none: never stopped)."""
        out, chunks = [], self.min_chunks * self.eta ** bracket
        while chunks < chunks_total:
            out.append(chunks)
            chunks *= self.eta
        return out

    def evaluates_at(self, run: str, chunks: int, chunks_total: int) -> bool:
        return self._halving_of(self.bracket_of(run, chunks_total)).evaluates_at(
            run, chunks, chunks_total)

    def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
        me = context.runs[run]
        bracket = self.bracket_of(run, me.chunks_total)
        halving = self._halving_of(bracket)
        if halving.rung_of(me.chunks_done) is None:  # not a rung: skip building the view
            return []
        view = self._views_of(context)[bracket]
        return [replace(d, reason=_in_bracket(bracket, d.reason))
                for d in halving.on_chunk_end(run, view)]

    def _views_of(self, context: Context) -> dict[int, Context]:
        """Each bracket's runs as a context of their own. Kept while the policy is asked with
        the same context (the engine's, updated in place) and brought up to date with the runs
        it replaced since: a decision costs what changed, not the number of runs."""
        changed: Iterable[str] = ()
        if self._source is context:
            changed = sorted(context.changed_since(self._synced), key=context.order)
            if any(self._placed.get(n, b) != b for n, b in self._brackets(context, changed)):
                self._source = None  # a run's plan changed its bracket: start over
        if self._source is not context:
            self._source, self._views, self._placed = context, {}, {}
            changed = context.runs
        self._synced = context.version
        moved: dict[int, list[RunHistory]] = {}
        for name, bracket in self._brackets(context, changed):
            self._placed[name] = bracket
            moved.setdefault(bracket, []).append(context.runs[name])
        for bracket, histories in moved.items():
            self._views.setdefault(bracket, Context({}, 0.0)).update(histories,
                                                                     context.wall_seconds)
        for view in self._views.values():
            view.wall_seconds = context.wall_seconds
        return self._views

    def _brackets(self, context: Context, names: Iterable[str]) -> Iterator[tuple[str, int]]:
        for name in names:
            yield name, self.bracket_of(name, context.runs[name].chunks_total)

    def _halving_of(self, bracket: int) -> SuccessiveHalving:
        if bracket not in self._halving:
            self._halving[bracket] = SuccessiveHalving(
                self.metric, self.mode, self.eta, self.min_chunks * self.eta ** bracket)
        return self._halving[bracket]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_bracket(bracket: int, reason: str) -> str:
    # "bracket 1, rung 0: eval_loss ..." reads as one phrase; other reasons get a colon.
    return f"bracket {bracket}{', ' if reason.startswith('rung ') else ': '}{reason}"


def _shares(eta: int, count: int) -> tuple[int, ...]:
    """Li et al.'s number of configs for each bracket, most aggressive first (integer ceil:
    the powers get large)."""
    return tuple(-(-count * eta ** (count - 1 - b) // (count - b)) for b in range(count))


def _bracket_at(shares: tuple[int, ...], place: int) -> int:
    """The bracket of ``place`` (0 <= place < sum(shares)) in the cycle where bracket ``b``'s
    ``k``-th place lies at ``(2k+1) / (2 shares[b])``, ties to the smaller bracket.

    Found by each place's rank in that order, not by listing the cycle: with many brackets
    the cycle is long (``eta**(S-1)`` places and more)."""
    for b, n in enumerate(shares):
        lo, hi = 0, n - 1
        while lo <= hi:  # ranks grow with k: binary search for the k of rank ``place``
            k = (lo + hi) // 2
            rank = _rank(shares, b, k)
            if rank == place:
                return b
            lo, hi = (k + 1, hi) if rank < place else (lo, k - 1)
    raise AssertionError(f"no bracket at place {place} of {shares}")  # ranks cover every place


def _rank(shares: tuple[int, ...], b: int, k: int) -> int:
    """How many places come before bracket ``b``'s ``k``-th place in the cycle."""
    rank = k
    for other, m in enumerate(shares):
        if other == b:
            continue
        # Places j of ``other`` (odd numbers 2j+1) with (2j+1)/m before (2k+1)/n, i.e.
        # (2j+1) * n < (2k+1) * m, or equal when ``other`` is the smaller bracket.
        bound, n = (2 * k + 1) * m, shares[b]
        top = bound // n if other < b else (bound - 1) // n  # the largest 2j+1 allowed
        rank += min(m, (top + 1) // 2)
    return rank
