"""TPE + successive halving, ours against transformers' own search (issue 48).

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
  ``search=OptunaSearch(<the same sampler, seed>, num_runs=--trials,
  max_concurrent=K)`` and ``policy=OptunaPruner(<the same pruner>)``, for each K of
  ``--max-concurrent`` (``--rf-sampler default``: OptunaSearch's own sampler instead, TPE
  seeded per trial from ``--seed``, what ``OptunaSearch(num_runs=...)`` uses).

Printed for each: the wall of the whole search; the time to its best (seconds from its start:
building the trainer, or ``hyperparameter_search``'s caller building the data, to the end of
the best completed trial, the one with the lowest final eval loss); that best value and its
config; optimizer steps trained over all trials; trials pruned; the same two times in CPU
seconds of this process (steadier than the wall when other processes share the cores); then
each ``rf`` against ``hf``: the time-to-best ratio (the target: <= 0.5), the steps ratio, and
the best values' relative difference (the target: within 0.1%). Our policy's cost: the
pruner's calls, trials created and replays (``OptunaPruner.stats``). ``--json`` adds each
trial's end (trial, steps, seconds).

Usage (on a quiet machine; ~2 min at the defaults, 1 torch thread)::

    python benchmarks/adaptive_search.py                      # 64 trials, K = 1 2 4
    python benchmarks/adaptive_search.py --max-concurrent 2 --rf-sampler default --skip-hf
    python benchmarks/adaptive_search.py --trials 8 --rows 128 --max-concurrent 2  # smoke

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SCHEDULERS = ["linear", "cosine", "constant"]
LR_MIN, LR_MAX = 1e-4, 1e-1


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
    outcome = Outcome("hf", wall=wall, cpu=cpu, trials=len(trials), completed=len(done),
                      pruned=sum(t.state == state.PRUNED for t in trials),
                      steps=sum(t.last_step or 0 for t in trials),
                      trace=[(t.number, t.last_step or 0,
                              round(t.datetime_complete.timestamp() - start, 3))
                             for t in trials if t.datetime_complete is not None],
                      values={t.number: dict(t.intermediate_values) for t in trials},
                      params={t.number: dict(t.params) for t in trials},
                      states={t.number: t.state.name for t in trials})
    if done:
        best = min(done, key=lambda t: t.value)
        outcome.best_loss, outcome.best_params = best.value, dict(best.params)
        outcome.time_to_best = best.datetime_complete.timestamp() - start
        outcome.cpu_to_best = evals[best.number][-1] - c0  # trials run in order, one each
    return outcome


def run_rf(bench: ModuleType, setup: dict[str, Any], args: argparse.Namespace, out: str,
           concurrent: int) -> Outcome:
    """One ``RFSFTTrainer``: OptunaSearch + OptunaPruner, ``concurrent`` runs at a time."""
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
            search=OptunaSearch(_sampler(args) if args.rf_sampler == "same" else None,
                                num_runs=args.trials, max_concurrent=concurrent,
                                seed=args.seed),
            policy=[policy, clock])
        rf.train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    records = read_schedule_csv(Path(out) / "schedule.csv")
    ends = {(r.run, r.end_step): r.end_time for r in records}
    outcome = Outcome(f"rf {concurrent}", wall=wall, cpu=cpu, trials=len(rf.runs),
                      steps=sum(r.end_step - r.start_step for r in records),
                      # Pruned as the study counts: stopped, or completed and pruned at
                      # its last report (Optuna's loop, as transformers' search runs it)
                      pruned=sum(r.status.value == "stopped" or bool(
                          policy.pruned_at_end(r.name)) for r in rf.runs),
                      policy=dict(getattr(policy, "stats", {})))
    last: dict[str, tuple[int, float]] = {}
    for r in records:
        last[r.run] = max(last.get(r.run, (0, 0.0)), (r.end_step, r.end_time - start))
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
    if finals:
        name = min(finals, key=lambda n: finals[n][0])
        loss, step, knobs = finals[name]
        outcome.best_loss = loss
        outcome.best_params = {k: knobs[k] for k in ("learning_rate", "lr_scheduler_type")}
        outcome.time_to_best = ends[(name, step)] - start
        outcome.cpu_to_best = clock.at[(name, step)] - c0
    return outcome


def warm_up(bench: ModuleType, setup: dict[str, Any], args: argparse.Namespace) -> None:
    """Both code paths once on two short trials, untimed (imports, first calls)."""
    from trl_rapidfire.testing import make_sft_dataset

    small = dict(setup, train=make_sft_dataset(32, seed=1), chunks=2)
    quick = argparse.Namespace(**{**vars(args), "trials": 2, "eval_every": 2})
    with tempfile.TemporaryDirectory() as tmp:
        run_hf(bench, small, quick, f"{tmp}/hf")
        run_rf(bench, small, quick, f"{tmp}/rf", 2)


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def show(o: Outcome) -> str:
    params = (f"lr {o.best_params['learning_rate']:.4g} {o.best_params['lr_scheduler_type']}"
              if o.best_params else "-")
    cost = (f"; pruner calls {o.policy['prune_calls']}, trials made {o.policy['trials_created']}"
            f", replays {o.policy['rebuilds']}" if o.policy else "")
    return (f"  {o.name:<6} wall {o.wall:6.1f} s, CPU {o.cpu:6.1f} s | best "
            f"{_f(o.best_loss, '.4f')} at {_f(o.time_to_best, '.1f')} s, CPU "
            f"{_f(o.cpu_to_best, '.1f')} s ({params}) | {o.steps:5d} steps, {o.trials} trials, "
            f"{o.pruned} pruned, {o.completed} completed{cost}")


def compare(hf: Outcome, ours: Outcome) -> dict[str, float | None]:
    """Ours against HF's: time to best and steps as ratios, the best values' difference."""
    ratio = (ours.time_to_best / hf.time_to_best
             if ours.time_to_best and hf.time_to_best else None)
    cpu = (ours.cpu_to_best / hf.cpu_to_best if ours.cpu_to_best and hf.cpu_to_best else None)
    diff = (abs(ours.best_loss - hf.best_loss) / abs(hf.best_loss)
            if ours.best_loss is not None and hf.best_loss else None)
    return {"time_to_best_ratio": ratio, "cpu_to_best_ratio": cpu,
            "steps_ratio": ours.steps / hf.steps if hf.steps else None,
            "best_relative_difference": diff}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--rows", type=int, default=1024, help="train rows (batch 8)")
    parser.add_argument("--eval-rows", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=2, help="steps between evaluations")
    parser.add_argument("--min-resource", default="2", help="steps, or auto")
    parser.add_argument("--reduction-factor", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-concurrent", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rf-sampler", choices=("same", "default"), default="same",
                        help="ours: transformers' sampler object (same), or OptunaSearch's "
                             "own (default: TPE seeded per trial from --seed)")
    parser.add_argument("--rf-eval-strategy", choices=("policy", "chunk"), default="policy",
                        help="ours: evaluate where the pruner reads (policy: its rung steps "
                             "and each run's end, the documented use with a policy) or at "
                             "every chunk end (chunk: every --eval-every steps, as HF does)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

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
    print(f"adaptive search: {args.trials} trials of TPE (seed {args.seed}) + "
          f"SuccessiveHalvingPruner(min_resource={args.min_resource}, reduction_factor="
          f"{args.reduction_factor}) over lr [{LR_MIN:g}, {LR_MAX:g}] log x {SCHEDULERS}; "
          f"{steps} steps a trial, eval every {args.eval_every} ({args.eval_rows} rows; ours: "
          f"eval_strategy={args.rf_eval_strategy!r}); "
          f"MLflow off; torch {torch.__version__}, {args.threads} thread(s), "
          f"{platform.machine()}, load {os.getloadavg()[0]:.1f}", flush=True)
    work = tempfile.mkdtemp(prefix="rf-adaptive-")
    outcomes: list[Outcome] = []
    try:
        warm_up(bench, setup, args)
        if not args.skip_hf:
            outcomes.append(run_hf(bench, setup, args, f"{work}/hf"))
            print(show(outcomes[-1]), flush=True)
        for k in args.max_concurrent:
            outcomes.append(run_rf(bench, setup, args, f"{work}/rf-{k}", k))
            print(show(outcomes[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, Any] = {}
    hf = next((o for o in outcomes if o.name == "hf"), None)
    if hf is not None:
        for o in outcomes:
            if o is hf:
                continue
            c = figures[o.name] = compare(hf, o)
            apart = c["best_relative_difference"]
            print(f"  {o.name} vs hf: time to best {_f(c['time_to_best_ratio'], '.2f')}x "
                  f"(CPU {_f(c['cpu_to_best_ratio'], '.2f')}x; target <= 0.5), steps "
                  f"{_f(c['steps_ratio'], '.2f')}x, best values "
                  f"{_f(None if apart is None else 100 * apart, '.3f')}% apart (target <= 0.1%)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "outcomes": [asdict(o) for o in outcomes],
                       "versus_hf": figures}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
