"""The two sides of ``time_to_best.py``: one ``RFSFTTrainer`` with a policy, and plain TRL's
``SFTTrainer`` one config after another; their MLflow stores, the policies and the baseline's
sample. Loaded by ``time_to_best.py`` (the benchmarks are no package), which passes itself as
``bench`` for the shared workload helpers.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

POLICIES = ("sh", "hyperband", "optuna")


class Unavailable(Exception):
    """A policy or peer that cannot run here (its package or class is missing)."""


@dataclass
class Config:
    learning_rate: float
    eval_loss: float | None
    chunks: int = 0
    status: str = "completed"
    reason: str = ""
    seconds: float = 0.0
    build: float = 0.0


@dataclass
class RFOutcome:
    wall: float  # construct + train() until it returns
    construct: float
    train: float
    chunks_trained: int
    first_metric: float | None  # construction start -> the first chunk's end
    time_to_best: float | None  # construction start -> the best run's last chunk's end
    best: Config | None
    runs: list[Config] = field(default_factory=list)
    parts: dict[str, Any] = field(default_factory=dict)


@dataclass
class BaselineOutcome:
    configs: list[Config]  # the sampled configs, each trained alone
    total: float  # their construct + train, summed
    parts: dict[str, Any] = field(default_factory=dict)

    def loss_of(self, lr: float) -> float | None:
        return next((c.eval_loss for c in self.configs if c.learning_rate == lr), None)

    def best(self) -> Config | None:
        return _best(self.configs)


def _best(configs: Sequence[Config]) -> Config | None:
    done = [c for c in configs if c.status == "completed" and c.eval_loss is not None
            and math.isfinite(c.eval_loss)]
    return min(done, key=lambda c: c.eval_loss) if done else None


@contextlib.contextmanager
def env(**values: str | None) -> Iterator[None]:
    """Environment variables set (``None``: unset) for the block, as they were after."""
    before = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_TEMPLATE: list[Path] = []  # an empty store, migrated once per process


def new_store(folder: str | Path) -> tuple[str, float]:
    """A new sqlite MLflow store in ``folder``: a copy of an empty store whose schema MLflow
    made once in this process (its migrations are ~2 s a new file; both sides get a new store
    per experiment, before their clocks start). Returns its URI and the seconds it took."""
    t = time.perf_counter()
    if not _TEMPLATE:
        from mlflow import MlflowClient

        home = Path(tempfile.mkdtemp(prefix="rf-time-to-best-store-"))
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        mlflow_log = logging.getLogger("mlflow")
        level = mlflow_log.level
        mlflow_log.setLevel(logging.WARNING)  # "Creating initial MLflow database tables..."
        try:
            MlflowClient(f"sqlite:///{home / 'mlflow.db'}").search_experiments()
        finally:
            mlflow_log.setLevel(level)
        _TEMPLATE.append(home / "mlflow.db")
    Path(folder).mkdir(parents=True, exist_ok=True)
    target = Path(folder).resolve() / "mlflow.db"
    shutil.copyfile(_TEMPLATE[0], target)
    return f"sqlite:///{target}", time.perf_counter() - t


def resolve_eval_strategy(bench: ModuleType, requested: str) -> tuple[str, str]:
    """``(used, note)``: ``policy`` if this trl_rapidfire accepts it, else ``chunk``."""
    if requested != "policy":
        return requested, ""
    from trl_rapidfire import RFSFTConfig

    with tempfile.TemporaryDirectory() as tmp, bench.quiet(), bench.warnings_off():
        try:
            RFSFTConfig(output_dir=tmp, num_chunks=2, eval_strategy="policy",
                        **bench.shared_kwargs())
        except (ValueError, TypeError) as err:
            return "chunk", (f"eval_strategy='policy' is not accepted by this trl_rapidfire "
                             f"({type(err).__name__}: {str(err)[:120]}); using 'chunk'")
    return "policy", ""


def build_policy(name: str, setup: dict[str, Any]) -> tuple[Any, Any, Any, str]:
    """``(policy, search, learning_rate knob, description)`` of one policy name; raises
    :class:`Unavailable` when its class or package is missing."""
    from trl_rapidfire import List, Range

    eta = setup["eta"]
    grid = List(list(setup["lrs"]))
    if name == "sh":
        from trl_rapidfire import SuccessiveHalving

        return (SuccessiveHalving("eval_loss", "min", eta=eta), None, grid,
                f"SuccessiveHalving('eval_loss', 'min', eta={eta}) over the grid")
    if name == "hyperband":
        try:
            from trl_rapidfire import Hyperband
        except (ImportError, AttributeError) as err:
            raise Unavailable("hyperband: not available yet") from err
        return (Hyperband("eval_loss", "min", eta=eta), None, grid,
                f"Hyperband('eval_loss', 'min', eta={eta}) over the grid")
    if name == "optuna":
        try:
            import optuna
        except ImportError as err:
            raise Unavailable("optuna: not installed (pip install optuna)") \
                from err
        from trl_rapidfire import OptunaPruner, OptunaSearch

        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=setup["chunk_steps"],
                                                        reduction_factor=eta)
        search = OptunaSearch(num_runs=setup["configs"],
                              max_concurrent=setup["optuna_concurrent"], seed=0)
        return (OptunaPruner(pruner), search, Range(setup["lr_min"], setup["lr_max"], log=True),
                f"OptunaSearch TPE (num_runs={setup['configs']}, max_concurrent="
                f"{setup['optuna_concurrent']}, seed 0) over Range({setup['lr_min']:g}, "
                f"{setup['lr_max']:g}, log) + OptunaPruner(SuccessiveHalvingPruner("
                f"min_resource={setup['chunk_steps']} steps, reduction_factor={eta}))")
    raise ValueError(f"unknown policy {name!r} (one of {', '.join(POLICIES)})")


def sample_rates(lrs: Sequence[float], k: int, include: Sequence[float] = ()) -> list[float]:
    """``k`` rates spread evenly (by position) over the log-spaced grid ``lrs``, each rate of
    ``include`` put in place of the nearest (in log) sampled rate not itself included (the
    ends last); all of ``lrs`` (and ``include``) when ``k >= len(lrs)``."""
    n = len(lrs)
    if k >= n:
        chosen = list(lrs)
    else:
        positions = [0] if k == 1 else sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
        chosen = [lrs[i] for i in positions]
    fixed: set[int] = set()
    for rate in include:
        if rate in chosen:
            fixed.add(chosen.index(rate))
            continue
        free = [j for j in range(len(chosen)) if j not in fixed] if k < n else []
        if not free:
            chosen.append(rate)
            fixed.add(len(chosen) - 1)
            continue
        inner = [j for j in free if 0 < j < len(chosen) - 1] or free
        j = min(inner, key=lambda j: abs(math.log(chosen[j]) - math.log(rate)))
        chosen[j] = rate
        fixed.add(j)
    return sorted(chosen)


def _final_eval_loss(trainer: Any) -> float | None:
    losses = [e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e]
    return float(losses[-1]) if losses else None


def run_baseline(bench: ModuleType, setup: dict[str, Any], rates: Sequence[float],
                 out: str, parts_module: ModuleType) -> BaselineOutcome:
    """Each rate trained to its end by its own plain ``SFTTrainer`` and evaluated once, at
    its last step (``eval_strategy="steps"``, ``eval_steps`` = its steps: the evaluation is
    inside ``train()`` and logged to the same MLflow run), one after another, tracked to a new
    store of its own. Timed: each config's construct + train."""
    from trl import SFTConfig, SFTTrainer

    uri, _ = new_store(f"{out}/store")
    configs = []
    with env(MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME=None), \
            parts_module.probes() as probes:
        for i, lr in enumerate(rates):
            t = time.perf_counter()
            with bench.quiet():
                trainer = SFTTrainer(
                    model=setup["model"],
                    args=SFTConfig(output_dir=f"{out}/config-{i}", learning_rate=lr,
                                   eval_strategy="steps", eval_steps=setup["steps"],
                                   **bench.shared_kwargs(setup["report_to"])),
                    train_dataset=setup["train"], eval_dataset=setup["evals"],
                    peft_config=bench.lora(),
                )
                t1 = time.perf_counter()
                trainer.train()
            seconds = time.perf_counter() - t
            configs.append(Config(lr, _final_eval_loss(trainer), setup["chunks"],
                                  seconds=seconds, build=t1 - t))
            del trainer
    gc.collect()
    total = sum(c.seconds for c in configs)
    return BaselineOutcome(configs, total, parts_module.baseline_breakdown(
        probes, total, sum(c.build for c in configs)))


def run_rapidfire(bench: ModuleType, setup: dict[str, Any], policy_name: str, out: str,
                  parts_module: ModuleType) -> RFOutcome:
    """One ``RFSFTTrainer`` over the configs with ``policy_name``, every feature on, tracked
    to a new store of its own (``MLFLOW_TRACKING_URI`` set before the trainer is built).
    Timed: construct + ``train()`` until it returns."""
    from trl_rapidfire import RFSFTConfig, RFSFTTrainer

    uri, _ = new_store(f"{out}/store")
    policy, search, lr_knob, _ = build_policy(policy_name, setup)
    with env(MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME=None), \
            parts_module.probes(policy) as probes:
        start = time.time()
        t0 = time.perf_counter()
        with bench.quiet():
            rf = RFSFTTrainer(
                model=setup["model"],
                args=RFSFTConfig(output_dir=f"{out}/experiment", learning_rate=lr_knob,
                                 num_chunks=setup["chunks"],
                                 eval_strategy=setup["eval_strategy"],
                                 **bench.shared_kwargs(setup["report_to"])),
                train_dataset=setup["train"], eval_dataset=setup["evals"],
                peft_config=bench.lora(), policy=policy, search=search,
            )
            t1 = time.perf_counter()
            rf.train()
        t2 = time.perf_counter()
    outcome = _rf_outcome(rf, start, t0, t1, t2)
    outcome.parts = parts_module.breakdown(probes, t0=t0, t1=t1, t2=t2, stats=rf.engine.stats,
                                           wall=outcome.wall)
    del rf
    gc.collect()
    return outcome


def _rf_outcome(rf: Any, start: float, t0: float, t1: float, t2: float) -> RFOutcome:
    schedule = rf.schedule
    reasons = {o.run: o.result for o in rf.op_log}
    per_run: dict[str, int] = {}
    last_end: dict[str, float] = {}
    for record in schedule:
        per_run[record.run] = per_run.get(record.run, 0) + 1
        last_end[record.run] = max(last_end.get(record.run, 0.0), record.end_time)
    runs, names = [], []
    for r in rf.runs:
        loss = r.metrics.get("eval_loss")
        runs.append(Config(float(r.knobs["learning_rate"]),
                           None if loss is None else float(loss), per_run.get(r.name, 0),
                           r.status.value, reasons.get(r.name, "")))
        names.append(r.name)
    best = _best(runs)
    to_best = None
    if best is not None:
        name = names[runs.index(best)]
        to_best = last_end[name] - start if name in last_end else None
    first = min((r.end_time for r in schedule), default=None)
    return RFOutcome(wall=t2 - t0, construct=t1 - t0, train=t2 - t1,
                     chunks_trained=len(schedule),
                     first_metric=None if first is None else first - start,
                     time_to_best=to_best, best=best, runs=runs)


def warm_up(bench: ModuleType, setup: dict[str, Any], policies: Sequence[str],
            parts_module: ModuleType) -> None:
    """Both code paths once on a few rows, untimed: imports, MLflow's first use, the first
    calls of every policy (Optuna's import and first study)."""
    from trl_rapidfire.testing import make_sft_dataset

    small = dict(setup, train=make_sft_dataset(32, seed=1), evals=make_sft_dataset(8, seed=9),
                 lrs=[1e-3, 1e-2], configs=2, chunks=2, steps=4, chunk_steps=2)
    with tempfile.TemporaryDirectory() as tmp, bench.quiet(), bench.warnings_off():
        run_baseline(bench, small, [1e-3], f"{tmp}/a", parts_module)
        for i, name in enumerate(policies):
            run_rapidfire(bench, small, name, f"{tmp}/b{i}", parts_module)


def cleanup(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
