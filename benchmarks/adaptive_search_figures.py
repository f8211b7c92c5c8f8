"""The figures of ``adaptive_search.py``: each side's outcome (times, steps, its best and the
trials' ends), how one side compares with transformers' (time and steps to the best, and to
within :data:`TOLERANCE` of transformers' best), and the lines and table it prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The best value's target: within 0.1% of transformers' (relative), or better
TOLERANCE = 1e-3


@dataclass
class Outcome:
    name: str
    wall: float = 0.0
    time_to_best: float | None = None
    # CPU seconds of this process from the start to the best trial's end: under load (other
    # processes on the cores) a steadier measure of the work than the wall
    cpu_to_best: float | None = None
    cpu: float = 0.0
    best_loss: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    # optimizer steps trained over all trials until the best trial's end (the deterministic
    # count behind time to best: the same at every repetition, whatever else loads the cores)
    steps_to_best: int | None = None
    trials: int = 0
    pruned: int = 0
    completed: int = 0
    policy: dict[str, int] = field(default_factory=dict)
    # (trial, steps trained, seconds from the start to its end), in the order trials ended
    trace: list[tuple[int, int, float]] = field(default_factory=list)
    # trial -> {step: eval loss} (HF: what its pruning callback reported; ours: every logged
    # evaluation), for telling where the two sides' decisions part (--json only)
    values: dict[int, dict[int, float]] = field(default_factory=dict)
    params: dict[int, dict[str, Any]] = field(default_factory=dict)  # trial -> its config
    states: dict[int, str] = field(default_factory=dict)  # trial -> COMPLETE, PRUNED, ...
    # (trial, steps trained over all trials at its end, seconds from the start, its final
    # value if it completed unpruned, else None), in the order trials ended
    ends: list[tuple[int, int, float, float | None]] = field(default_factory=list)
    seed: int = 0



def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _x(value: float | None) -> str:
    """A ratio: ``0.46x``; ``never`` where ours never got there."""
    return "never" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.3f}%"


def show(o: Outcome) -> str:
    params = (f"lr {o.best_params['learning_rate']:.4g} {o.best_params['lr_scheduler_type']}"
              if o.best_params else "-")
    cost = (f"; pruner calls {o.policy['prune_calls']}, trials made {o.policy['trials_created']}"
            f", replays {o.policy['rebuilds']}" if o.policy else "")
    return (f"  {o.name:<10} wall {o.wall:6.1f} s, CPU {o.cpu:6.1f} s | best "
            f"{_f(o.best_loss, '.4f')} at {_f(o.time_to_best, '.1f')} s, CPU "
            f"{_f(o.cpu_to_best, '.1f')} s, {_f(o.steps_to_best, 'd')} steps ({params}) | "
            f"{o.steps:5d} steps, {o.trials} trials, {o.pruned} pruned, {o.completed} "
            f"completed{cost}")


def reached(o: Outcome, value: float, tolerance: float) -> tuple[float, int] | None:
    """Seconds and steps (over all trials) from the start to the end of ``o``'s first trial
    that completed within ``tolerance`` (relative) of ``value`` or below it; ``None``: none."""
    bound = value + tolerance * abs(value)
    return next(((seconds, steps) for _, steps, seconds, final in o.ends
                 if final is not None and final <= bound), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(hf: Outcome, ours: Outcome, tolerance: float = TOLERANCE) -> dict[str, float | None]:
    """Ours against HF's: time and steps to the best as ratios (to ours, and to a trial within
    ``tolerance`` of theirs: what a person waits for a config as good as theirs), the best
    values' difference (signed: > 0 is ours worse; and its size, as before)."""
    diff = (abs(ours.best_loss - hf.best_loss) / abs(hf.best_loss)
            if ours.best_loss is not None and hf.best_loss else None)
    gap = (ours.best_loss - hf.best_loss) / abs(hf.best_loss) \
        if ours.best_loss is not None and hf.best_loss else None
    theirs = reached(ours, hf.best_loss, tolerance) if hf.best_loss is not None else None
    return {"time_to_best_ratio": _ratio(ours.time_to_best, hf.time_to_best),
            "cpu_to_best_ratio": _ratio(ours.cpu_to_best, hf.cpu_to_best),
            "steps_ratio": _ratio(ours.steps, hf.steps),
            "steps_to_best_ratio": _ratio(ours.steps_to_best, hf.steps_to_best),
            "time_to_theirs_ratio": _ratio(theirs and theirs[0], hf.time_to_best),
            "steps_to_theirs_ratio": _ratio(theirs and theirs[1], hf.steps_to_best),
            "best_gap": gap, "best_relative_difference": diff}


def versus(name: str, c: dict[str, float | None]) -> str:
    gap = c["best_gap"]
    return (f"  {name} vs hf: time to best {_x(c['time_to_best_ratio'])} (CPU "
            f"{_x(c['cpu_to_best_ratio'])}; target <= 0.5), steps to best "
            f"{_x(c['steps_to_best_ratio'])}, steps {_x(c['steps_ratio'])}; "
            f"to a trial within {100 * TOLERANCE:g}% of hf's best: time "
            f"{_x(c['time_to_theirs_ratio'])}, steps "
            f"{_x(c['steps_to_theirs_ratio'])}; best "
            f"{_pct(gap)} (target <= +{100 * TOLERANCE:g}%)")


def summary(seed: int, hf: Outcome, ours: list[Outcome],
            figures: dict[str, dict[str, float | None]]) -> str:
    """One line: the seed's transformers figures and each of ours against them: time (and
    steps) to its own best, to a trial within the tolerance of hf's best, the best's gap;
    ``targets met`` where both the latter time is <= 0.5x and the gap within the tolerance
    (``its best too`` where the time to its own best is <= 0.5x as well)."""
    cells = []
    for o in ours:
        c = figures[o.name]
        gap, theirs, own = c["best_gap"], c["time_to_theirs_ratio"], c["time_to_best_ratio"]
        met = theirs is not None and theirs <= 0.5 and gap is not None and gap <= TOLERANCE
        cells.append(f"{o.name}: its best {_x(own)} ({_x(c['steps_to_best_ratio'])} steps), "
                     f"hf's {_x(theirs)} ({_x(c['steps_to_theirs_ratio'])} steps), "
                     f"{_pct(gap)}" + (" targets met" if met else "")
                     + (", its best too" if met and own is not None and own <= 0.5 else ""))
    return (f"seed {seed}: hf best {_f(hf.best_loss, '.4f')} at {_f(hf.time_to_best, '.1f')} s "
            f"({_f(hf.steps_to_best, 'd')} steps to it, {hf.steps} in all) | "
            + " | ".join(cells))


def table(rows: list[tuple[int, Outcome, list[Outcome], dict[str, Any]]]) -> list[str]:
    """The docs' table: a row per seed and side; ours against transformers' of that seed."""
    lines = ["| seed | side | time to best | vs hf | steps to best | vs hf | to within "
             f"{100 * TOLERANCE:g}% of hf's best: time, steps | best eval loss | gap | "
             "steps | pruned |", "| --- | --- |" + " ---: |" * 9]
    for seed, hf, ours, figures in rows:
        lines.append(f"| {seed} | transformers | {_f(hf.time_to_best, '.1f')} s | | "
                     f"{_f(hf.steps_to_best, 'd')} | | | {_f(hf.best_loss, '.4f')} | | "
                     f"{hf.steps} | {hf.pruned} |")
        for o in ours:
            c = figures[o.name]
            lines.append(
                f"| {seed} | {o.name} | {_f(o.time_to_best, '.1f')} s | "
                f"{_x(c['time_to_best_ratio'])} | {_f(o.steps_to_best, 'd')} | "
                f"{_x(c['steps_to_best_ratio'])} | {_x(c['time_to_theirs_ratio'])}, "
                f"{_x(c['steps_to_theirs_ratio'])} | {_f(o.best_loss, '.4f')} | "
                f"{_pct(c['best_gap'])} | {o.steps} | {o.pruned} |")
    return lines


def best_of(tries: list[Outcome]) -> Outcome:
    """A side's repetition with the lowest time to best; its counts are every repetition's
    (one worker trains a deterministic schedule), and a difference is printed."""
    counts = {(o.steps, o.steps_to_best, o.best_loss, o.pruned) for o in tries}
    if len(counts) > 1:
        print(f"  NOTE: {tries[0].name}'s counts differ between repetitions: {sorted(counts)}",
              flush=True)
    return min(tries, key=lambda o: (o.time_to_best is None, o.time_to_best or 0.0))
