"""Search methods at the same budget of chunks: ``time_to_best.py --searches``.

The workload is ``time_to_best.py``'s (tiny offline Llama + LoRA, the same train and eval sets,
``num_chunks`` chunks a run, ``eval_strategy="chunk"``) over a two-knob space:
``learning_rate=Range(1e-4, 1e-1, log=True)`` x ``lr_scheduler_type=List(["linear", "cosine",
"constant"])``. Four methods, one ``RFSFTTrainer`` each, for every seed ``s``:

1. ``random``: ``RandomSearch(num_runs=R, seed=s)``, every run trained to its end;
2. ``successive halving``: ``RandomSearch(num_runs=N, seed=s)`` +
   ``SuccessiveHalving("eval_loss", eta=eta)``; its work sets the budget
   ``B = halving_work(N, chunks, eta)`` (48 chunks at 16 configs x 16 chunks, eta 2);
3. ``TPE``: ``OptunaSearch(num_runs=R, max_concurrent=1, seed=s)``, full runs, one at a time
   (with two at a time, the third proposal would come when one result is in, before TPE's
   two startup trials are: R runs of random search);
4. ``TPE + pruner``: ``OptunaSearch(num_runs=N, max_concurrent=2, seed=s)`` +
   ``OptunaPruner(SuccessiveHalvingPruner(min_resource=<steps of one chunk>,
   reduction_factor=eta))`` + ``Budget(max_total_steps=<B chunks' steps>)``: without the
   budget it trains 2-2.7x B (Optuna's ASHA promotes early arrivals and a run past the last
   rung trains to its end); with it, the search proposes nothing once B is spent.

``R = B // chunks``, so 1 and 3 train exactly ``B`` chunks (3 runs at the defaults). Every
experiment trains until its own end; then it is *measured at the budget*: its
``schedule.csv`` rows, in the order the chunks finished, cut to the first ``B``. Figures:

* best eval loss within B: the lowest ``eval_loss`` logged at a chunk end (each run is
  evaluated at each of its chunk ends) among those ``B`` chunks, of any run, partial or
  complete;
* time to it: seconds from the start of the ``RFSFTTrainer``'s construction (so that building
  the trainer counts the same for every method) to the ``end_time`` of the chunk at whose end
  that value was first logged (the chunk-end evaluation runs inside the chunk's span);
* chunks trained: what the method really spent (it may pass ``B``: 4 does, usually);
* best completed: the lowest final eval loss of the runs that completed within the budget.

The averaged table gives each figure's mean over seeds (the best loss with its sample standard
deviation), the method with the lowest mean best loss and its lead (absolute and relative) over
the runner-up and over ``random``, and, per seed, which methods reached within 1% of that
seed's best loss of all methods, and how soon; the fastest is the one that reached it for the
most seeds, then soonest on average.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

METHODS = ("random", "successive halving", "TPE", "TPE + pruner")
SCHEDULERS = ["linear", "cosine", "constant"]
MAX_CONCURRENT = 2
WITHIN = 0.01  # "reached the best": within 1% of the seed's best loss of all methods


@dataclass
class Point:
    """One chunk end within the budget: where it fell in the experiment and what it logged."""

    chunk: int  # 1-based position among the experiment's chunks, in the order they finished
    run: str
    step: int
    seconds: float  # from the trainer's construction start to the chunk's end
    eval_loss: float | None


@dataclass
class Outcome:
    method: str
    seed: int
    chunks_trained: int  # the whole experiment's
    chunks_in_budget: int
    runs: int  # runs the experiment created
    best_loss: float | None  # within the budget
    seconds_to_best: float | None
    best_run: str = ""
    best_step: int = 0
    best_knobs: dict[str, Any] = field(default_factory=dict)
    best_completed: float | None = None  # the best final eval loss of runs done within budget
    completed_in_budget: int = 0
    build_seconds: float = 0.0  # constructing the trainer
    wall_seconds: float = 0.0  # construct + train(), the whole experiment
    model_proposals: int | None = None  # OptunaSearch: proposals made past TPE's startup
    trace: list[Point] = field(default_factory=list)

    def seconds_to(self, target: float) -> float | None:
        """When a chunk end within the budget first logged a loss <= ``target``."""
        return next((p.seconds for p in self.trace
                     if p.eval_loss is not None and p.eval_loss <= target), None)


def budget(configs: int, chunks: int, eta: int, bench: ModuleType) -> tuple[int, int]:
    """``(B, R)``: the budget in chunks (successive halving's work) and the full runs in it."""
    spend = bench.halving_work(configs, chunks, eta)
    return spend, max(1, spend // chunks)


def method_parts(method: str, seed: int, configs: int, runs: int, eta: int,
                 chunk_steps: int, spend: int) -> tuple[Any, Any]:
    """``(search, policy)`` of one method (``spend``: the budget in chunks)."""
    from trl_rapidfire import Budget, RandomSearch, SuccessiveHalving

    if method == "random":
        return RandomSearch(num_runs=runs, seed=seed), None
    if method == "successive halving":
        return RandomSearch(num_runs=configs, seed=seed), SuccessiveHalving("eval_loss", eta=eta)
    import optuna

    from trl_rapidfire import OptunaPruner, OptunaSearch

    if method == "TPE":
        return OptunaSearch(num_runs=runs, max_concurrent=1, seed=seed), None
    if method == "TPE + pruner":
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=chunk_steps,
                                                        reduction_factor=eta)
        return (OptunaSearch(num_runs=configs, max_concurrent=MAX_CONCURRENT, seed=seed),
                [OptunaPruner(pruner), Budget(max_total_steps=spend * chunk_steps)])
    raise ValueError(f"unknown method {method!r}")


def run_method(bench: ModuleType, setup: dict[str, Any], method: str, seed: int,
               out: str) -> Outcome:
    """Train one method's experiment to its end, then measure it at the budget."""
    from trl_rapidfire import List, Range, RFSFTConfig, RFSFTTrainer

    search, policy = method_parts(method, seed, setup["configs"], setup["runs"], setup["eta"],
                                  setup["chunk_steps"], setup["budget"])
    kwargs = bench.shared_kwargs()
    kwargs.pop("lr_scheduler_type")  # a knob here
    start, t0 = time.time(), time.perf_counter()
    with bench.quiet():
        rf = RFSFTTrainer(
            model=setup["model"],
            args=RFSFTConfig(output_dir=out,
                             learning_rate=Range(bench.LR_MIN, bench.LR_MAX, log=True),
                             lr_scheduler_type=List(SCHEDULERS), num_chunks=setup["chunks"],
                             eval_strategy="chunk", **kwargs),
            train_dataset=setup["train"], eval_dataset=setup["evals"], peft_config=bench.lora(),
            search=search, policy=policy,
        )
        t1 = time.perf_counter()
        rf.train()
    wall = time.perf_counter() - t0
    outcome = measure(rf, out, start, setup["budget"], setup["steps"], method, seed)
    outcome.build_seconds, outcome.wall_seconds = t1 - t0, wall
    if method.startswith("TPE"):
        outcome.model_proposals = model_proposals(out, getattr(search, "num_runs", 0))
    return outcome


def chunk_end_losses(rf: Any) -> dict[tuple[str, int], float]:
    """``(run, step) -> eval_loss`` of every evaluation the runs logged."""
    losses = {}
    for run in rf.runs:
        trainer = rf.run_trainer(run.name)
        for entry in trainer.state.log_history if trainer is not None else ():
            if "eval_loss" in entry:
                losses[(run.name, int(entry["step"]))] = float(entry["eval_loss"])
    return losses


def measure(rf: Any, out: str, start: float, spend: int, steps: int, method: str,
            seed: int) -> Outcome:
    from trl_rapidfire.storage.schedule import read_schedule_csv

    records = sorted(read_schedule_csv(Path(out) / "schedule.csv"), key=lambda r: r.end_time)
    losses = chunk_end_losses(rf)
    knobs = {r.name: r.knobs for r in rf.runs}
    trace = [Point(i + 1, r.run, r.end_step, r.end_time - start,
                   losses.get((r.run, r.end_step)))
             for i, r in enumerate(records[:spend])]
    finite = [p for p in trace if p.eval_loss is not None and math.isfinite(p.eval_loss)]
    best = min(finite, key=lambda p: (p.eval_loss, p.chunk), default=None)  # the first lowest
    done = [p.eval_loss for p in finite if p.step == steps]
    outcome = Outcome(method, seed, len(records), len(trace), len(rf.runs),
                      best.eval_loss if best else None, best.seconds if best else None,
                      best_completed=min(done) if done else None,
                      completed_in_budget=sum(1 for p in trace if p.step == steps), trace=trace)
    if best is not None:
        outcome.best_run, outcome.best_step = best.run, best.step
        outcome.best_knobs = {k: knobs[best.run][k] for k in ("learning_rate",
                                                               "lr_scheduler_type")}
    return outcome


def model_proposals(out: str, num_runs: int) -> int:
    """How many of OptunaSearch's proposals came after TPE's random startup trials: results
    told before the proposal >= its ``n_startup_trials`` (``min(10, max(2, num_runs // 4))``,
    counting COMPLETE and PRUNED trials, which is all this benchmark tells)."""
    startup = min(10, max(2, num_runs // 4))
    told = made = 0
    with open(Path(out) / "search.csv", newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if row["event"] == "told":
                told += 1
            elif row["event"] == "proposed" and told >= startup:
                made += 1
    return made


def warm_up(bench: ModuleType, model: str) -> None:
    """One tiny OptunaSearch + OptunaPruner experiment, untimed (imports, first calls)."""
    from trl_rapidfire.testing import make_sft_dataset

    small = dict(model=model, train=make_sft_dataset(32, seed=1),
                 evals=make_sft_dataset(8, seed=9), configs=2, runs=2, eta=2, chunks=2,
                 chunk_steps=2, budget=4, steps=4)
    with tempfile.TemporaryDirectory() as tmp, bench.warnings_off():
        run_method(bench, small, "TPE + pruner", 0, f"{tmp}/w")


def _f(value: float | None, spec: str = ".4f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def print_seed(outcomes: list[Outcome], spend: int) -> None:
    seed = outcomes[0].seed
    print(f"\nseed {seed}: budget B = {spend} chunks")
    print(f"  {'method':<18} | {'trained':>7} {'in B':>5} | {'best eval_loss':>14} "
          f"{'time to it':>10} | {'best config (run, step)':<38} | best completed")
    print("  " + "-" * 118)
    for o in outcomes:
        config = (f"lr {o.best_knobs['learning_rate']:.3g} {o.best_knobs['lr_scheduler_type']}"
                  f" ({o.best_run}, {o.best_step})" if o.best_knobs else "-")
        done = (f"{o.best_completed:.4f} ({o.completed_in_budget} done)"
                if o.best_completed is not None else "none done")
        print(f"  {o.method:<18} | {o.chunks_trained:7d} {o.chunks_in_budget:5d} | "
              f"{_f(o.best_loss):>14} {_f(o.seconds_to_best, '.1f'):>8} s | {config:<38} | "
              f"{done}")


def summarize(outcomes: list[Outcome], seeds: list[int]) -> dict[str, Any]:
    """Means over seeds, the winner on mean best loss, and who reached within 1% first."""
    targets = {}
    for s in seeds:
        bests = [o.best_loss for o in outcomes if o.seed == s and o.best_loss is not None]
        if bests:
            targets[s] = min(bests) + WITHIN * abs(min(bests))
    table = {}
    for m in METHODS:
        mine = [o for o in outcomes if o.method == m]
        bests = [o.best_loss for o in mine if o.best_loss is not None]
        reached = [t for t in (o.seconds_to(targets[o.seed]) for o in mine
                               if o.seed in targets) if t is not None]
        table[m] = {
            "chunks_trained": _mean([o.chunks_trained for o in mine]),
            "chunks_in_budget": _mean([o.chunks_in_budget for o in mine]),
            "best_loss": _mean(bests), "best_loss_sd": _sd(bests),
            "seconds_to_best": _mean([o.seconds_to_best for o in mine
                                      if o.seconds_to_best is not None]),
            "best_completed": _mean([o.best_completed for o in mine
                                     if o.best_completed is not None]),
            "seeds_with_completed": sum(o.best_completed is not None for o in mine),
            "within_1pct_seeds": len(reached), "within_1pct_seconds": _mean(reached),
            "wall_seconds": _mean([o.wall_seconds for o in mine]),
        }
    ranked = sorted((m for m in METHODS if table[m]["best_loss"] is not None),
                    key=lambda m: table[m]["best_loss"])
    winner = {}
    if ranked:
        top = table[ranked[0]]["best_loss"]
        winner = {"method": ranked[0], "best_loss": top, "margins": {
            m: {"absolute": table[m]["best_loss"] - top,
                "relative": (table[m]["best_loss"] - top) / abs(top) if top else None}
            for m in ranked[1:]}}
    fast = sorted((m for m in METHODS if table[m]["within_1pct_seeds"]),
                  key=lambda m: (-table[m]["within_1pct_seeds"], table[m]["within_1pct_seconds"]))
    return {"targets": {str(s): t for s, t in targets.items()}, "methods": table,
            "ranking": ranked, "winner": winner, "fastest_within_1pct": fast[0] if fast else None}


def print_summary(summary: dict[str, Any], seeds: list[int], spend: int) -> None:
    table, n = summary["methods"], len(seeds)
    print(f"\naveraged over {n} seed(s) {seeds}: budget B = {spend} chunks each")
    print(f"  {'method':<18} | {'trained':>7} {'in B':>5} | {'best within B (mean ± sd)':>25} "
          f"{'time to it':>10} | {'within 1% of the seed best':>26} | best completed")
    print("  " + "-" * 118)
    for m in METHODS:
        t = table[m]
        loss = (f"{t['best_loss']:.4f} ± {t['best_loss_sd']:.4f}"
                if t["best_loss"] is not None else "-")
        within = (f"{t['within_1pct_seeds']}/{n} seeds, {t['within_1pct_seconds']:.1f} s"
                  if t["within_1pct_seeds"] else f"0/{n} seeds")
        done = (f"{t['best_completed']:.4f} ({t['seeds_with_completed']}/{n} seeds)"
                if t["best_completed"] is not None else f"none (0/{n} seeds)")
        print(f"  {m:<18} | {t['chunks_trained']:7.1f} {t['chunks_in_budget']:5.1f} | "
              f"{loss:>25} {_f(t['seconds_to_best'], '.1f'):>8} s | {within:>26} | {done}")
    winner = summary["winner"]
    if winner:
        print(f"\nlowest mean best eval loss within B: {winner['method']} "
              f"({winner['best_loss']:.4f})")
        for m, margin in winner["margins"].items():
            rel = f"{margin['relative']:.2%}" if margin["relative"] is not None else "-"
            print(f"  ahead of {m:<18} by {margin['absolute']:.4f} ({rel})")
    fastest = summary["fastest_within_1pct"]
    if fastest:
        t = table[fastest]
        print(f"fastest to within 1% of each seed's best loss: {fastest} "
              f"({t['within_1pct_seeds']}/{n} seeds, {t['within_1pct_seconds']:.1f} s on average)")


def _plain(value: Any) -> Any:
    """NaN and infinities as ``null``: the JSON stays standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def main(args: Any, bench: ModuleType) -> int:
    """The ``--searches`` mode of ``time_to_best.py`` (``bench``: that module, whose workload
    helpers this shares); ``args`` are its parsed arguments."""
    import optuna  # noqa: F401 - fail before anything trains when it is missing

    from trl_rapidfire.engine.chunks import plan_chunks
    from trl_rapidfire.testing import make_sft_dataset, tiny_model_path

    threads = torch.get_num_threads()
    seeds = list(args.seeds)
    steps = math.ceil(args.rows / bench.BATCH_SIZE)
    chunk_steps = plan_chunks(steps, steps, args.chunks).boundaries[0]
    spend, runs = budget(args.configs, args.chunks, args.eta, bench)
    model = tiny_model_path()
    setup = dict(model=model, train=make_sft_dataset(args.rows, seed=1),
                 evals=make_sft_dataset(bench.EVAL_ROWS, seed=9), configs=args.configs,
                 runs=runs, eta=args.eta, chunks=args.chunks, chunk_steps=chunk_steps,
                 budget=spend, steps=steps)
    print(f"search comparison: lr Range({bench.LR_MIN:g}, {bench.LR_MAX:g}, log) x "
          f"{len(SCHEDULERS)} schedulers; {steps} steps a run in {args.chunks} chunks of "
          f"{chunk_steps}, eval {bench.EVAL_ROWS} rows; budget B = {spend} chunks (successive "
          f"halving of {args.configs}, eta {args.eta}), R = {runs} full runs; seeds {seeds}; "
          f"torch {torch.__version__}, {threads} thread(s), {platform.machine()}, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)

    work = tempfile.mkdtemp(prefix="rf-searches-")
    outcomes: list[Outcome] = []
    try:
        warm_up(bench, model)
        with bench.warnings_off():
            for seed in seeds:
                for i, method in enumerate(METHODS):
                    o = run_method(bench, setup, method, seed, f"{work}/{seed}-{i}")
                    outcomes.append(o)
                    print(f"  seed {seed} {method:<18} {o.chunks_trained:3d} chunks, "
                          f"{o.runs:2d} runs, {o.wall_seconds:6.1f} s; best within B "
                          f"{_f(o.best_loss)} at {_f(o.seconds_to_best, '.1f')} s"
                          + ("" if o.model_proposals is None else
                             f"; {o.model_proposals} of {o.runs} proposals past TPE's startup"),
                          flush=True)
                print_seed(outcomes[-len(METHODS):], spend)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary = summarize(outcomes, seeds)
    print_summary(summary, seeds, spend)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(_plain({"mode": "searches", "budget_chunks": spend, "full_runs": runs,
                              "configs": args.configs, "chunks": args.chunks, "steps": steps,
                              "chunk_steps": chunk_steps, "rows": args.rows, "eta": args.eta,
                              "seeds": seeds, "threads": threads,
                              "time_origin": "RFSFTTrainer construction start",
                              "outcomes": [asdict(o) for o in outcomes], "summary": summary}),
                      fh, indent=2)
    return 0
