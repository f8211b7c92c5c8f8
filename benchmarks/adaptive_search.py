"""TPE + successive halving, ours against transformers' own search (issues 48 and 56).

Workload (``time_to_best.py``'s tiny offline Llama with LoRA rank 8 on q_proj and v_proj,
``--rows`` rows of its synthetic SFT data, batch 8: 128 steps a trial at 1024 rows, linear
decay unless the schedule is searched, an eval set of ``--eval-rows`` rows, eval batch 32),
MLflow off (``report_to="none"``), searched over ``learning_rate`` log-uniform in
[1e-4, 1e-1] x ``lr_scheduler_type`` in (linear, cosine, constant), ``--trials`` trials, each
evaluated every ``--eval-every`` steps:

* ``hf``: ``transformers.Trainer.hyperparameter_search(backend="optuna")`` with
  ``optuna.samplers.TPESampler(seed=--seed)`` and
  ``optuna.pruners.SuccessiveHalvingPruner(min_resource=--min-resource,
  reduction_factor=--reduction-factor)``: trials one after another, each reporting its eval
  loss at every evaluation and pruned at once when the pruner says so. TRL's ``SFTTrainer``
  takes no ``model_init``, so a plain ``Trainer`` trains the data TRL tokenized (an
  ``SFTTrainer`` built once, inside the timed span) with TRL's collator, and ``model_init``
  loads the tiny model with a fresh LoRA adapter (as ``time_to_best_peers.py``).
* ``rf K``: one ``RFSFTTrainer`` with ``num_chunks`` = steps / ``--eval-every``,
  ``eval_strategy=--rf-eval-strategy`` (``policy``, the default: evaluated where the pruner
  reads, i.e. at the chunk ends that pass a rung step, and at each run's end, which prunes
  exactly as ``chunk`` does; ``chunk``: at every chunk end, HF's evaluations),
  ``search=OptunaSearch(num_runs=--trials, max_concurrent=K, seed=--seed)`` and
  ``policy=OptunaPruner(<the same pruner>)``, for each K of ``--max-concurrent``
  (``default``: no ``max_concurrent`` given, OptunaSearch's default, which is 4). Its sampler:
  OptunaSearch's own (``--rf-sampler default``: TPE seeded per trial from the seed, with the
  constant liar, what ``OptunaSearch(num_runs=...)`` uses), the same without the constant
  liar (``no-liar``: Optuna 4.x's default, and what a trial in flight was to it: nothing), or
  transformers' sampler object (``same``: one at a time, ours then trains exactly the trials
  transformers trains). ``--rf-order``: OptunaSearch's ``order`` (``even``, the default:
  the runs in the rotation side by side; ``promote``: a new run's first chunk, then the most
  advanced run).

For each seed of ``--seed`` (0 1 2 3), every side runs ``--repeats`` times (2), the sides
alternated (hf, rf 1, rf 4, then the reverse order), and each side keeps its best
repetition (the lowest time to best). Its counts are the same at every repetition (one worker
trains a deterministic schedule; a difference is printed).

Printed for each run: the wall of the whole search; the time to its best (seconds from its
start: building the trainer, or ``hyperparameter_search``'s caller building the data, to the
end of the best completed trial, the one with the lowest final eval loss) and the optimizer
steps trained over all trials until then (steps to best: the deterministic count behind the
time, whatever else loads the machine); that best value and its config; the steps over all
trials; trials pruned; the two times in CPU seconds of this process. Then, per seed, each
``rf`` against ``hf``: the time-to-best ratio (the target: <= 0.5), steps to best and in all
as ratios, the time and steps until ours completed a trial within 0.1% of hf's best (what a
person waits for a config as good as transformers'), and the best's gap (signed; the target:
<= +0.1%); a summary line per seed; at the end a table, a row per seed, as
docs/adaptive-search.md holds it. Our policy's cost: the pruner's calls, trials created and
replays (``OptunaPruner.stats``). ``--json`` adds each trial's end (trial, steps, seconds)
and every repetition.

Usage (on a quiet machine; ~10 min at the defaults, 1 torch thread)::

    python benchmarks/adaptive_search.py                # seeds 0-3 x (hf, 1, 4 = default) x 2
    python benchmarks/adaptive_search.py --seed 0 --max-concurrent 1 2 4 --rf-sampler same
    python benchmarks/adaptive_search.py --repeats 1 --seed 0 1 2 3 4 5 6 7 8 9 10 11 \
        --max-concurrent 1 2 4 8                      # the counts (the docs' 12 seeds), once
    python benchmarks/adaptive_search.py --repeats 1 --max-concurrent 4 --rf-sampler no-liar
    python benchmarks/adaptive_search.py --repeats 1 --seed 0 1 2 3 4 5 6 7 8 9 10 11 \
        --max-concurrent default --rf-order promote   # the docs' promote row
    python benchmarks/adaptive_search.py --trials 8 --rows 128 --seed 0 --repeats 1  # smoke

Runs offline on CPU (``HF_HUB_OFFLINE=1``); on a CUDA machine it runs unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared modules
from adaptive_search_figures import (  # noqa: E402
    Outcome,
    best_of,
    compare,
    show,
    summary,
    table,
    versus,
)

SCHEDULERS = ["linear", "cosine", "constant"]
LR_MIN, LR_MAX = 1e-4, 1e-1
def _bench() -> ModuleType:
    """``time_to_best.py`` beside this file (its workload helpers)."""
    path = Path(__file__).with_name("time_to_best.py")
    spec = importlib.util.spec_from_file_location("rf_time_to_best", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The trainers' prints (plain transformers prints each log dict), warnings and Optuna's
    INFO lines, out of the figures."""
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        optuna.logging.set_verbosity(level)


def _pruner(args: argparse.Namespace) -> Any:
    import optuna

    low: Any = "auto" if args.min_resource == "auto" else int(args.min_resource)
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=low,
                                                  reduction_factor=args.reduction_factor)


def _sampler(args: argparse.Namespace) -> Any:
    import optuna

    return optuna.samplers.TPESampler(seed=args.seed)


def _rf_sampler(args: argparse.Namespace) -> Any:
    """Ours: transformers' sampler object (``same``), OptunaSearch's own (``None``), or its own
    without the constant liar (a function of the seed, as OptunaSearch's default makes it)."""
    import optuna

    if args.rf_sampler == "same":
        return _sampler(args)
    if args.rf_sampler == "default":
        return None
    startup = min(10, max(2, args.trials // 4))  # OptunaSearch's default
    return lambda seed: optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup,
                                                   constant_liar=False)


def _kwargs(bench: ModuleType) -> dict[str, Any]:
    kwargs = bench.shared_kwargs("none")
    kwargs.pop("lr_scheduler_type")  # searched
    return kwargs


def run_hf(bench: ModuleType, setup: dict[str, Any], args: argparse.Namespace,
           out: str) -> Outcome:
    """transformers' ``hyperparameter_search`` with Optuna: one trial at a time."""
    import optuna
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from trl import SFTConfig, SFTTrainer

    storage = optuna.storages.InMemoryStorage()
    evals: list[list[float]] = []  # per trial, the CPU seconds at each evaluation

    class Clock(TrainerCallback):
        def on_train_begin(self, *a: Any, **kw: Any) -> None:
            evals.append([])

        def on_evaluate(self, *a: Any, **kw: Any) -> None:
            evals[-1].append(time.process_time())

    def model_init(trial: Any = None) -> Any:
        return get_peft_model(AutoModelForCausalLM.from_pretrained(setup["model"]), bench.lora())

    def space(trial: Any) -> dict[str, Any]:
        return {"learning_rate": trial.suggest_float("learning_rate", LR_MIN, LR_MAX, log=True),
                "lr_scheduler_type": trial.suggest_categorical("lr_scheduler_type", SCHEDULERS)}

    start, t0, c0 = time.time(), time.perf_counter(), time.process_time()
    with _quiet():
        prep = SFTTrainer(model=setup["model"],
                          args=SFTConfig(output_dir=f"{out}/prep", **bench.shared_kwargs()),
                          train_dataset=setup["train"], eval_dataset=setup["evals"],
                          peft_config=bench.lora())
        trainer = Trainer(
            model_init=model_init,
            args=TrainingArguments(output_dir=f"{out}/hp", eval_strategy="steps",
                                   eval_steps=args.eval_every, remove_unused_columns=False,
                                   **_kwargs(bench)),
            train_dataset=prep.train_dataset, eval_dataset=prep.eval_dataset,
            data_collator=prep.data_collator, callbacks=[Clock()])
        trainer.hyperparameter_search(
            hp_space=space, backend="optuna", n_trials=args.trials, direction="minimize",
            study_name="hf", storage=storage, sampler=_sampler(args), pruner=_pruner(args))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    trials = optuna.load_study(study_name="hf", storage=storage).trials
    state = optuna.trial.TrialState
    done = [t for t in trials if t.state == state.COMPLETE]
    outcome = Outcome("hf", seed=args.seed, wall=wall, cpu=cpu, trials=len(trials),
                      completed=len(done),
                      pruned=sum(t.state == state.PRUNED for t in trials),
                      steps=sum(t.last_step or 0 for t in trials),
                      trace=[(t.number, t.last_step or 0,
                              round(t.datetime_complete.timestamp() - start, 3))
                             for t in trials if t.datetime_complete is not None],
                      values={t.number: dict(t.intermediate_values) for t in trials},
                      params={t.number: dict(t.params) for t in trials},
                      states={t.number: t.state.name for t in trials})
    trained = 0
    for t in sorted((t for t in trials if t.datetime_complete is not None),
                    key=lambda t: t.number):  # one after another
        trained += t.last_step or 0
        outcome.ends.append((t.number, trained, round(t.datetime_complete.timestamp() - start, 3),
                             t.value if t.state == state.COMPLETE else None))
    if done:
        best = min(done, key=lambda t: t.value)
        outcome.best_loss, outcome.best_params = best.value, dict(best.params)
        outcome.steps_to_best = next(e[1] for e in outcome.ends if e[0] == best.number)
        outcome.time_to_best = best.datetime_complete.timestamp() - start
        outcome.cpu_to_best = evals[best.number][-1] - c0  # trials run in order, one each
    return outcome


def run_rf(bench: ModuleType, setup: dict[str, Any], args: argparse.Namespace, out: str,
           concurrent: int | None) -> Outcome:
    """One ``RFSFTTrainer``: OptunaSearch + OptunaPruner, ``concurrent`` runs at a time
    (``None``: OptunaSearch's default)."""
    from trl_rapidfire import List, OptunaPruner, OptunaSearch, Range, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.control.policies import Context, Decision, Policy
    from trl_rapidfire.storage.schedule import read_schedule_csv

    class Clock(Policy):
        """Not a decision maker: the CPU seconds at each chunk end (each run's evaluation)."""

        def __init__(self) -> None:
            self.at: dict[tuple[str, int], float] = {}

        def on_chunk_end(self, run: str, context: Context) -> list[Decision]:
            me = context.runs[run]
            if me.chunks_done:
                self.at[(run, me.chunk_ends[me.chunks_done - 1])] = time.process_time()
            return []

        def evaluates_at(self, run: str, chunks: int, chunks_total: int) -> bool:
            return False  # it reads no metric: the pruner alone sets the cadence

    policy, clock = OptunaPruner(_pruner(args)), Clock()
    start, t0, c0 = time.time(), time.perf_counter(), time.process_time()
    with _quiet():
        rf = RFSFTTrainer(
            model=setup["model"],
            args=RFSFTConfig(output_dir=out, learning_rate=Range(LR_MIN, LR_MAX, log=True),
                             lr_scheduler_type=List(SCHEDULERS), num_chunks=setup["chunks"],
                             eval_strategy=args.rf_eval_strategy, **_kwargs(bench)),
            train_dataset=setup["train"], eval_dataset=setup["evals"], peft_config=bench.lora(),
            search=OptunaSearch(_rf_sampler(args), num_runs=args.trials, seed=args.seed,
                                order=args.rf_order,
                                **({} if concurrent is None else {"max_concurrent": concurrent})),
            policy=[policy, clock])
        rf.train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    records = read_schedule_csv(Path(out) / "schedule.csv")
    ends = {(r.run, r.end_step): r.end_time for r in records}
    outcome = Outcome(f"rf {concurrent or 'default'}", seed=args.seed, wall=wall, cpu=cpu,
                      trials=len(rf.runs),
                      steps=sum(r.end_step - r.start_step for r in records),
                      # Pruned as the study counts: stopped, or completed and pruned at
                      # its last report (Optuna's loop, as transformers' search runs it)
                      pruned=sum(r.status.value == "stopped" or bool(
                          policy.pruned_at_end(r.name)) for r in rf.runs),
                      policy=dict(getattr(policy, "stats", {})))
    last: dict[str, tuple[int, float]] = {}
    trained, at_end = 0, {}
    for r in sorted(records, key=lambda r: r.end_time):
        last[r.run] = max(last.get(r.run, (0, 0.0)), (r.end_step, r.end_time - start))
        trained += r.end_step - r.start_step
        at_end[r.run] = trained  # steps over all runs when its last chunk so far ended
    outcome.trace = sorted(((int(n.split("-")[-1]), s, round(t, 3)) for n, (s, t) in last.items()),
                           key=lambda x: x[2])
    finals = {}
    for run in rf.runs:
        trainer = rf.run_trainer(run.name)
        losses = [(int(e["step"]), float(e["eval_loss"])) for e in trainer.state.log_history
                  if "eval_loss" in e] if trainer is not None else []
        outcome.values[int(run.name.split("-")[-1])] = dict(losses)
        number = int(run.name.split("-")[-1])
        outcome.params[number] = {k: run.knobs[k] for k in ("learning_rate", "lr_scheduler_type")}
        outcome.states[number] = ("PRUNED" if run.status.value == "stopped"
                                  or policy.pruned_at_end(run.name) else
                                  "COMPLETE" if run.status.value == "completed" else "FAIL")
        if run.status.value != "completed" or policy.pruned_at_end(run.name):
            continue
        if losses:
            step, loss = max(losses)
            finals[run.name] = (loss, step, run.knobs)
    outcome.completed = len(finals)
    outcome.ends = sorted(((int(n.split("-")[-1]), at_end[n], round(last[n][1], 3),
                            finals[n][0] if n in finals else None) for n in at_end),
                          key=lambda e: e[1])
    if finals:
        name = min(finals, key=lambda n: finals[n][0])
        loss, step, knobs = finals[name]
        outcome.steps_to_best = at_end[name]
        outcome.best_loss = loss
        outcome.best_params = {k: knobs[k] for k in ("learning_rate", "lr_scheduler_type")}
        outcome.time_to_best = ends[(name, step)] - start
        outcome.cpu_to_best = clock.at[(name, step)] - c0
    return outcome


def warm_up(bench: ModuleType, setup: dict[str, Any], args: argparse.Namespace) -> None:
    """Both code paths once on two short trials, untimed (imports, first calls)."""
    from trl_rapidfire.testing import make_sft_dataset

    small = dict(setup, train=make_sft_dataset(32, seed=1), chunks=2)
    quick = argparse.Namespace(**{**vars(args), "trials": 2, "eval_every": 2,
                                  "seed": args.seed[0]})
    with tempfile.TemporaryDirectory() as tmp:
        run_hf(bench, small, quick, f"{tmp}/hf")
        run_rf(bench, small, quick, f"{tmp}/rf", 2)


def _side(value: str) -> int | None:
    if value == "default":
        return None
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a number of runs (>= 1), or default")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--rows", type=int, default=1024, help="train rows (batch 8)")
    parser.add_argument("--eval-rows", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=2, help="steps between evaluations")
    parser.add_argument("--min-resource", default="2", help="steps, or auto")
    parser.add_argument("--reduction-factor", type=int, default=2)
    parser.add_argument("--seed", type=int, nargs="+", default=[0, 1, 2, 3],
                        help="sampler seeds, each a comparison of its own")
    parser.add_argument("--max-concurrent", type=_side, nargs="+", default=[1, 4],
                        metavar="K", help="ours: runs at a time, each a side of its own "
                        "(4 is OptunaSearch's default; 'default': none given)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="each side this many times, alternated; each keeps its best")
    parser.add_argument("--rf-sampler", choices=("same", "default", "no-liar"),
                        default="default",
                        help="ours: OptunaSearch's own sampler (default: TPE seeded per trial "
                             "from --seed, with the constant liar, what OptunaSearch(num_runs="
                             "...) uses), the same without the liar (no-liar), or "
                             "transformers' sampler object (same)")
    parser.add_argument("--rf-eval-strategy", choices=("policy", "chunk"), default="policy",
                        help="ours: evaluate where the pruner reads (policy: its rung steps "
                             "and each run's end, the documented use with a policy) or at "
                             "every chunk end (chunk: every --eval-every steps, as HF does)")
    parser.add_argument("--rf-order", choices=("even", "promote"), default="even",
                        help="OptunaSearch's order: even (the default) or promote")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    import datasets
    import torch
    import transformers

    from trl_rapidfire.testing import make_sft_dataset, tiny_model_path

    torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    bench = _bench()
    steps = math.ceil(args.rows / bench.BATCH_SIZE)
    if steps % args.eval_every:
        parser.error(f"--eval-every {args.eval_every} does not divide the {steps} steps")
    setup = dict(model=tiny_model_path(), train=make_sft_dataset(args.rows, seed=1),
                 evals=make_sft_dataset(args.eval_rows, seed=9),
                 chunks=steps // args.eval_every)
    print(f"adaptive search: {args.trials} trials of TPE (seeds {args.seed}) + "
          f"SuccessiveHalvingPruner(min_resource={args.min_resource}, reduction_factor="
          f"{args.reduction_factor}) over lr [{LR_MIN:g}, {LR_MAX:g}] log x {SCHEDULERS}; "
          f"{steps} steps a trial, eval every {args.eval_every} ({args.eval_rows} rows; ours: "
          f"eval_strategy={args.rf_eval_strategy!r}, sampler {args.rf_sampler!r}, "
          f"order {args.rf_order!r}); "
          f"{args.repeats} alternated repetition(s), each side's best; MLflow off; torch "
          f"{torch.__version__}, {args.threads} thread(s), {platform.machine()}, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    sides: list[int | None | str] = ([] if args.skip_hf else ["hf"]) + list(args.max_concurrent)
    work = tempfile.mkdtemp(prefix="rf-adaptive-")
    tries: list[Outcome] = []
    results: list[tuple[int, Outcome | None, list[Outcome], dict[str, Any]]] = []
    try:
        warm_up(bench, setup, args)
        for seed in args.seed:
            per_seed = argparse.Namespace(**{**vars(args), "seed": seed})
            done: dict[str, list[Outcome]] = {}
            for rep in range(args.repeats):
                print(f"seed {seed}, repetition {rep + 1} of {args.repeats}:", flush=True)
                for side in (sides if rep % 2 == 0 else sides[::-1]):  # alternated
                    out = f"{work}/{seed}-{rep}-{side}"
                    o = (run_hf(bench, setup, per_seed, out) if side == "hf"
                         else run_rf(bench, setup, per_seed, out, side))  # type: ignore[arg-type]
                    shutil.rmtree(out, ignore_errors=True)
                    tries.append(o)
                    done.setdefault(o.name, []).append(o)
                    print(show(o), flush=True)
            best = {name: best_of(group) for name, group in done.items()}
            hf = best.pop("hf", None)
            figures: dict[str, Any] = {}
            if hf is not None:
                figures = {name: compare(hf, o) for name, o in best.items()}
                for name, c in figures.items():
                    print(versus(name, c), flush=True)
                print(summary(seed, hf, list(best.values()), figures), flush=True)
            results.append((seed, hf, list(best.values()), figures))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    compared = [(s, hf, ours, f) for s, hf, ours, f in results if hf is not None and ours]
    if compared:
        print("\n".join(["", *table(compared)]))  # type: ignore[arg-type]
    if args.json:
        outcomes = [o for _, hf, ours, _ in results for o in ([hf] if hf else []) + ours]
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "outcomes": [asdict(o) for o in outcomes],
                       "repetitions": [asdict(o) for o in tries],
                       "versus_hf": {str(s): f for s, _, _, f in results}}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
