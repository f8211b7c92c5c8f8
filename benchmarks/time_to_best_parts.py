"""Where an experiment's time went, measured from outside the package: ``time_to_best.py``.

:func:`probes` wraps a few methods with timers for the length of a ``with`` block, and
nothing in ``trl_rapidfire`` knows about it:

* ``SFTTrainer.training_step`` (one forward + backward of a batch; the optimizer step is
  outside it), ``SFTTrainer.evaluate`` (a whole evaluation: its loop, its logging, the
  callbacks) and ``SFTTrainer.prediction_step`` (the forward passes inside an evaluation):
  on TRL's class, which every run trainer of trl-rapidfire and every plain ``SFTTrainer``
  inherits;
* the tracker of trl-rapidfire: ``Tracker.__init__`` (the experiment's MLflow experiment and
  parent run), ``Tracker.ensure_run`` (registration: one run's MLflow run with its params and
  tags), ``Tracker.suspend`` (the final flush when ``train()`` ends) and the methods its
  background thread runs (``_write_pending``, ``_poll``, ``_beat``). Every call's start and
  end are kept, with its thread, so a call is placed in construction or in ``train()`` by its
  times wherever it runs (registration may move to a background thread);
* transformers' ``MLflowCallback`` (``setup``, ``on_log``, ``on_train_end``): what plain TRL
  pays for ``report_to="mlflow"`` (its ``end_run`` waits for MLflow's async-logging thread,
  up to a second);
* ``gc.collect`` (accelerate's ``free_memory`` at every ``train()`` start, and the engine's
  own before it freezes what the experiment holds): a full collection costs more the more
  the process holds;
* the policy instance's ``on_chunk_end`` (each decision the engine asks for).

A wrapper costs about a microsecond a call (:func:`wrapper_cost` measures it on this machine);
:meth:`Probes.overhead` is calls x that cost, printed beside the figures so that the timed
walls can be read as uninstrumented (it is far below 1% of a wall: tens of microseconds a
chunk against milliseconds of training).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timer:
    """Every call of the methods wrapped with it: ``(start, end)`` perf_counter seconds, and
    the threads they ran on. A wrapped call made inside another of the same timer (an override
    calling ``super()``, ``on_log`` calling ``setup``) is counted once, in the outer one."""

    name: str
    spans: list[tuple[float, float]] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    local: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def calls(self) -> int:
        return len(self.spans)

    @property
    def total(self) -> float:
        return sum(end - start for start, end in self.spans)

    def within(self, lo: float, hi: float) -> tuple[int, float]:
        """Calls that started in ``[lo, hi)`` and their total seconds."""
        inside = [(s, e) for s, e in self.spans if lo <= s < hi]
        return len(inside), sum(e - s for s, e in inside)

    def inside(self, outer: Timer) -> float:
        """Seconds of this timer's calls made inside ``outer``'s calls (on the same thread)."""
        starts = sorted(outer.spans)
        keys = [s for s, _ in starts]
        total = 0.0
        for s, e in self.spans:
            i = bisect.bisect_right(keys, s) - 1
            if i >= 0 and starts[i][1] >= e:
                total += e - s
        return total

    def summary(self) -> dict[str, Any]:
        return {"calls": self.calls, "seconds": self.total,
                "ms_each": 1000 * self.total / self.calls if self.calls else None,
                "longest_ms": 1000 * max((e - s for s, e in self.spans), default=0.0),
                "threads": sorted(self.threads)}


@dataclass
class Probes:
    timers: dict[str, Timer]

    def __getitem__(self, name: str) -> Timer:
        return self.timers[name]

    def calls(self) -> int:
        return sum(t.calls for t in self.timers.values())

    def overhead(self) -> float:
        """Seconds the wrappers themselves added (calls x a wrapper's cost)."""
        return self.calls() * wrapper_cost()


def _timed(original: Callable[..., Any], timer: Timer) -> Callable[..., Any]:
    local = timer.local

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(local, "depth", 0):
            return original(*args, **kwargs)
        local.depth = 1
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timer.spans.append((start, time.perf_counter()))
            timer.threads.add(threading.current_thread().name)
            local.depth = 0

    return wrapper


@contextlib.contextmanager
def _patched(owner: Any, attr: str, timer: Timer) -> Iterator[None]:
    """``owner.attr`` timed for the block (a class: set on it even when inherited; an
    instance: an attribute of its own), put back as it was afterwards."""
    had_own = attr in vars(owner)
    own = vars(owner).get(attr)
    setattr(owner, attr, _timed(getattr(owner, attr), timer))
    try:
        yield
    finally:
        if had_own:
            setattr(owner, attr, own)
        else:
            delattr(owner, attr)


_NAMES = ("training_step", "evaluate", "prediction_step", "tracker_setup", "store_open",
          "ensure_run", "registering", "tracking_flush", "tracker_thread", "mlflow_callback",
          "on_chunk_end", "gc_collect")


@contextlib.contextmanager
def probes(policy: Any = None) -> Iterator[Probes]:
    """Time the methods listed in the module's docstring while the block runs."""
    from transformers.integrations import MLflowCallback
    from trl import SFTTrainer

    from trl_rapidfire.tracking.tracker import Tracker

    timers = {name: Timer(name) for name in _NAMES}
    # Tracker methods of either shape the tracker has had: registering in ensure_run on the
    # caller's thread, or ensure_run queueing and the tracking thread opening the store
    # (_open) and making the runs in batches (_register_batch). Missing ones are not timed.
    targets = [
        (SFTTrainer, "training_step", "training_step"), (SFTTrainer, "evaluate", "evaluate"),
        (SFTTrainer, "prediction_step", "prediction_step"),
        (Tracker, "__init__", "tracker_setup"), (Tracker, "_open", "store_open"),
        (Tracker, "ensure_run", "ensure_run"), (Tracker, "_register_batch", "registering"),
        (Tracker, "suspend", "tracking_flush"),
        (Tracker, "_write_pending", "tracker_thread"), (Tracker, "_poll", "tracker_thread"),
        (Tracker, "_beat", "tracker_thread"), (Tracker, "_register_next", "tracker_thread"),
        (Tracker, "_register_all", "tracker_thread"),
        (MLflowCallback, "setup", "mlflow_callback"), (MLflowCallback, "on_log", "mlflow_callback"),
        (MLflowCallback, "on_train_end", "mlflow_callback"), (gc, "collect", "gc_collect"),
    ] + [(each, "on_chunk_end", "on_chunk_end") for each in _policies(policy)]
    with contextlib.ExitStack() as stack:
        for owner, attr, name in targets:
            if hasattr(owner, attr):  # a private method gone in a later version: not timed
                stack.enter_context(_patched(owner, attr, timers[name]))
        yield Probes(timers)


def _policies(policy: Any) -> list[Any]:
    """The policy objects whose decisions are timed: the one given, or each of a list (the
    engine asks a combination, which asks each: timing the parts times every decision)."""
    if policy is None:
        return []
    return list(policy) if isinstance(policy, list | tuple) else [policy]


@functools.cache
def wrapper_cost() -> float:
    """Seconds a timed wrapper adds to one call (median of 5 x 20,000 calls)."""
    def plain() -> None:
        return None

    timed = _timed(plain, Timer("cost"))
    costs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20_000):
            plain()
        t1 = time.perf_counter()
        for _ in range(20_000):
            timed()
        t2 = time.perf_counter()
        costs.append(max(0.0, (t2 - t1) - (t1 - t0)) / 20_000)
    return sorted(costs)[2]


def breakdown(probes_: Probes, *, t0: float, t1: float, t2: float, stats: Any,
              wall: float) -> dict[str, Any]:
    """Where one RF experiment's ``wall`` went. ``t0``/``t1``/``t2``: perf_counter at the
    start of construction, its end (train() called) and train()'s return; ``stats``: the
    engine's ``EngineStats`` (``wall``: its run loop; ``compute``: inside the runs' turns)."""
    p = probes_
    reg_build = p["ensure_run"].within(t0, t1)
    reg_train = p["ensure_run"].within(t1, t2)
    steps, evals, fwd = p["training_step"], p["evaluate"], p["prediction_step"]
    in_turns = steps.total + evals.total
    return {
        "construction_s": t1 - t0,
        "tracker_setup_s": p["tracker_setup"].total,
        "store_open": p["store_open"].summary(),
        "registration": {**p["ensure_run"].summary(),
                         "in_construction": {"calls": reg_build[0], "seconds": reg_build[1]},
                         "in_train": {"calls": reg_train[0], "seconds": reg_train[1]},
                         "batches": p["registering"].summary()},
        "train_s": t2 - t1,
        "engine_loop_s": stats.wall,
        "turns_compute_s": stats.compute,
        "training_steps": steps.summary(),
        "evaluation": {**evals.summary(),
                       "forward_ms_each": (1000 * fwd.total / evals.calls
                                           if evals.calls else None),
                       "forward_passes": fwd.calls},
        "rest_of_turns_s": max(stats.compute - in_turns, 0.0),
        "switching_s": stats.switching,
        "turns": stats.turns,
        "ms_per_turn_switching": 1000 * stats.switching / stats.turns if stats.turns else None,
        "checkpoints": stats.checkpoints,
        "checkpoint_in_turn_s": stats.checkpoint_in_turn,
        "checkpoint_writing_s": stats.checkpoint_writing,
        "policy": p["on_chunk_end"].summary(),
        "outside_loop_s": max((t2 - t1) - stats.wall, 0.0),
        "gc_collect": p["gc_collect"].summary(),
        "gc_in_train_longest_s": max((e - s for s, e in p["gc_collect"].spans if t1 <= s < t2),
                                     default=0.0),
        "tracking_flush": p["tracking_flush"].summary(),
        "tracker_thread": p["tracker_thread"].summary(),
        "mlflow_callback": p["mlflow_callback"].summary(),
        "instrumentation_s": p.overhead(),
        "instrumentation_share": p.overhead() / wall if wall else None,
        "wall_s": wall,
    }


def baseline_breakdown(probes_: Probes, seconds: float, build: float) -> dict[str, Any]:
    """Where the plain-TRL sample's ``seconds`` went (``build``: its trainers' construction):
    training steps, evaluation (less the MLflow logging inside it), transformers'
    ``MLflowCallback`` (creating each config's run, logging its params, metrics, ending it)."""
    p = probes_
    mlflow = p["mlflow_callback"].total
    evaluation = p["evaluate"].total - p["mlflow_callback"].inside(p["evaluate"])
    steps = p["training_step"].total
    collect = p["gc_collect"].total
    return {"seconds": seconds, "build_s": build, "training_steps": p["training_step"].summary(),
            "evaluation_s": evaluation, "evaluations": p["evaluate"].calls,
            "mlflow_callback": p["mlflow_callback"].summary(),
            "gc_collect": p["gc_collect"].summary(),
            "rest_s": max(seconds - build - steps - evaluation - mlflow - collect, 0.0),
            "instrumentation_s": p.overhead()}


def _pct(seconds: float, wall: float) -> str:
    return f"{100 * seconds / wall:4.0f}%" if wall else "    -"


def _each(summary: dict[str, Any]) -> str:
    if not summary["calls"]:
        return "no calls"
    return f"{summary['calls']} x {summary['ms_each']:.1f} ms"


def print_baseline(parts: dict[str, Any], configs: int) -> None:
    n = max(configs, 1)
    steps, ml = parts["training_steps"], parts["mlflow_callback"]
    rows = [("build", parts["build_s"]), ("training steps", steps["seconds"]),
            ("evaluation", parts["evaluation_s"]), ("MLflowCallback", ml["seconds"]),
            ("gc.collect", parts["gc_collect"]["seconds"]), ("rest of train()", parts["rest_s"])]
    print("    a config: " + " + ".join(f"{label} {sec / n:.2f} s" for label, sec in rows)
          + f"  ({_each(steps)} steps; MLflowCallback {_each(ml)})")


def print_breakdown(parts: dict[str, Any]) -> None:
    wall = parts["wall_s"]
    reg = parts["registration"]
    ev = parts["evaluation"]
    where = ("; " + ", ".join(f"{k.split('_')[1]} {v['calls']} calls {v['seconds']:.2f} s"
                              for k, v in (("in_construction", reg["in_construction"]),
                                           ("in_train", reg["in_train"])) if v["calls"]))
    threads = ", ".join(reg["threads"]) or "-"
    flush, thread = parts["tracking_flush"], parts["tracker_thread"]
    gc_ = parts["gc_in_train_longest_s"]  # the engine's own, at the start of train()
    print(f"  where RF's time went (this repetition; the timers added "
          f"{1000 * parts['instrumentation_s']:.1f} ms = "
          f"{100 * (parts['instrumentation_share'] or 0):.3f}% of its wall):")
    batches = reg["batches"]
    made = (f"; the MLflow runs made on the tracking thread: {batches['calls']} batch(es), "
            f"{batches['seconds']:.2f} s, concurrent" if batches["calls"] else "")
    opened = parts["store_open"]
    rows = [
        ("construction (trainer built)", parts["construction_s"],
         f"MLflow tracker {parts['tracker_setup_s']:.2f} s"
         + (f" (+ the store opened on its thread {opened['seconds']:.2f} s)"
            if opened["calls"] else "")),
        ("  registration (ensure_run)", reg["seconds"],
         f"{_each(reg)}, thread {threads}{where}{made}"),
        ("train() until it returns", parts["train_s"], ""),
        ("  runs' turns (engine compute)", parts["turns_compute_s"], ""),
        ("    training steps", parts["training_steps"]["seconds"],
         f"{_each(parts['training_steps'])} (forward + backward)"),
        ("    evaluation", ev["seconds"],
         f"{_each(ev)}" + (f"; its forward passes {ev['forward_ms_each']:.1f} ms of each "
                           f"({ev['forward_passes']} in all)" if ev["calls"] else "")),
        ("    rest of the turns", parts["rest_of_turns_s"],
         "optimizer steps, logging, data loading, boundary callbacks"),
        ("  switching (engine)", parts["switching_s"],
         f"{parts['turns']} turns"
         + (f", {parts['ms_per_turn_switching']:.1f} ms a turn"
            if parts["ms_per_turn_switching"] is not None else "")
         + f"; {parts['checkpoints']} checkpoints ({parts['checkpoint_in_turn_s']:.2f} s in "
           f"turns, {parts['checkpoint_writing_s']:.2f} s on the writer thread)"),
        ("    policy decisions", parts["policy"]["seconds"], _each(parts["policy"])),
        ("  outside the engine's loop", parts["outside_loop_s"],
         f"the engine's full gc.collect() before it {gc_:.2f} s, the "
         f"final MLflow flush {flush['seconds']:.2f} s, the best run activated"),
    ]
    for label, seconds, note in rows:
        print(f"    {label:<32} {seconds:8.2f} s {_pct(seconds, wall)}  {note}".rstrip())
    print(f"    MLflow tracking thread busy {thread['seconds']:.2f} s ({_each(thread)}: "
          f"registrations, writes, polls, heartbeats; concurrent with the above)"
          + (f"; plain MLflowCallback in run trainers: {_each(parts['mlflow_callback'])}"
             if parts["mlflow_callback"]["calls"] else ""))
