"""Peers of ``time_to_best.py --peers``: the same search done with other tools, on the same
workload (tiny model, LoRA, rows, eval set, learning rates log-uniform over the same range,
N trials, an evaluation at every chunk's worth of steps and at the end, successive halving by
eta), each measured once:

* ``hf-optuna``: transformers' ``Trainer.hyperparameter_search(backend="optuna")`` with TPE
  (seed 0) and ``optuna.pruners.SuccessiveHalvingPruner(min_resource=<a chunk's steps>,
  reduction_factor=eta)``. It needs ``model_init``, which TRL 1.16's ``SFTTrainer`` does not
  take, so a plain transformers ``Trainer`` trains: ``model_init`` returns the tiny model with
  a fresh LoRA adapter (``peft.get_peft_model``), and the data are the ones TRL tokenized (an
  ``SFTTrainer`` built once for them, inside the timed span: the user has to), with TRL's
  collator. Its losses equal ``SFTTrainer``'s for the same learning rate (checked when
  it was written: 5.7429375648498535 both).
* ``ray-asha``: Ray Tune (``ray[tune]``) with ``ASHAScheduler(max_t=<chunks>, grace_period=1,
  reduction_factor=eta)`` (rungs at 1, eta, eta**2, ... evaluations) and ``tune.loguniform``
  (random search, seed 0), one trial at a time (one worker, as RF here), actors reused; each
  trial a plain TRL ``SFTTrainer`` that reports its eval loss to Tune at every evaluation.
  Timed from ``ray.init`` (starting Ray is what a user waits for).

Each is skipped, with its reason, when its package is missing. Figures: the wall of the whole
search, its best completed trial's final eval loss and learning rate, and the seconds from its
start to that trial's end (time to its best).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

PEERS = ("hf-optuna", "ray-asha")


@dataclass
class PeerOutcome:
    name: str
    available: bool
    note: str = ""
    wall: float | None = None
    time_to_best: float | None = None
    best_loss: float | None = None
    best_lr: float | None = None
    trials: int = 0
    pruned: int = 0


def _final_eval_callback() -> Any:
    """Evaluate at the last step too (where a chunk's steps do not divide the run's)."""
    from transformers import TrainerCallback

    class FinalEval(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= state.max_steps:
                control.should_evaluate = True

    return FinalEval()


def hf_optuna(bench: ModuleType, sides: ModuleType, setup: dict[str, Any], out: str,
              timeout: float) -> PeerOutcome:
    try:
        import optuna
    except ImportError:
        return PeerOutcome("hf-optuna", False, "optuna is not installed")
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from trl import SFTConfig, SFTTrainer

    uri, _ = sides.new_store(f"{out}/store")
    kwargs = bench.shared_kwargs(setup["report_to"])
    storage = optuna.storages.InMemoryStorage()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def model_init(trial: Any = None) -> Any:
        return get_peft_model(AutoModelForCausalLM.from_pretrained(setup["model"]), bench.lora())

    start, t0 = time.time(), time.perf_counter()
    with sides.env(MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME=None), bench.quiet():
        prep = SFTTrainer(model=setup["model"],
                          args=SFTConfig(output_dir=f"{out}/prep", **bench.shared_kwargs()),
                          train_dataset=setup["train"], eval_dataset=setup["evals"],
                          peft_config=bench.lora())
        trainer = Trainer(
            model_init=model_init,
            args=TrainingArguments(output_dir=f"{out}/hp", eval_strategy="steps",
                                   eval_steps=setup["chunk_steps"], remove_unused_columns=False,
                                   **kwargs),
            train_dataset=prep.train_dataset, eval_dataset=prep.eval_dataset,
            data_collator=prep.data_collator, callbacks=[_final_eval_callback()])
        trainer.hyperparameter_search(
            hp_space=lambda trial: {"learning_rate": trial.suggest_float(
                "learning_rate", setup["lr_min"], setup["lr_max"], log=True)},
            backend="optuna", n_trials=setup["configs"], direction="minimize",
            timeout=timeout, study_name="hf-optuna", storage=storage,
            sampler=optuna.samplers.TPESampler(seed=0),
            pruner=optuna.pruners.SuccessiveHalvingPruner(
                min_resource=setup["chunk_steps"], reduction_factor=setup["eta"]))
    wall = time.perf_counter() - t0
    trials = optuna.load_study(study_name="hf-optuna", storage=storage).trials
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    outcome = PeerOutcome("hf-optuna", True, wall=wall, trials=len(trials),
                          pruned=sum(t.state == optuna.trial.TrialState.PRUNED for t in trials))
    if done:
        best = min(done, key=lambda t: t.value)
        outcome.best_loss, outcome.best_lr = best.value, best.params["learning_rate"]
        outcome.time_to_best = best.datetime_complete.timestamp() - start
    return outcome


def ray_asha(bench: ModuleType, sides: ModuleType, setup: dict[str, Any], out: str,
             timeout: float) -> PeerOutcome:
    try:
        import ray
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler
        from ray.tune.search import BasicVariantGenerator
    except ImportError:
        return PeerOutcome("ray-asha", False, "ray[tune] is not installed (pip install "
                                              "'ray[tune]')")
    uri, _ = sides.new_store(f"{out}/store")
    steps, threads = setup["steps"], setup["threads"]
    model, chunk_steps = setup["model"], setup["chunk_steps"]  # what the trainable captures
    kwargs = bench.shared_kwargs(setup["report_to"])
    lora = bench.lora()
    final_eval = _final_eval_callback()

    def trainable(config: dict[str, Any], train: Any = None, evals: Any = None) -> None:
        # Nested: Ray pickles it by value (this module is not importable in its workers).
        import torch
        from ray import tune as ray_tune
        from transformers import TrainerCallback
        from trl import SFTConfig, SFTTrainer

        torch.set_num_threads(threads)

        class Report(TrainerCallback):
            def on_evaluate(self, args, state, control, metrics=None, **kw):
                ray_tune.report({"eval_loss": metrics["eval_loss"], "step": state.global_step,
                                 "wall": time.time()})

        folder = tempfile.mkdtemp(prefix="ray-trial-")
        try:
            trainer = SFTTrainer(
                model=model,
                args=SFTConfig(output_dir=folder, learning_rate=config["learning_rate"],
                               eval_strategy="steps", eval_steps=chunk_steps, **kwargs),
                train_dataset=train, eval_dataset=evals, peft_config=lora,
                callbacks=[Report(), final_eval])
            trainer.train()
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # Ray's session files, removed afterwards (a short path: its sockets' paths are limited).
    session = tempfile.mkdtemp(prefix="ray-")
    ray_log = logging.getLogger("ray")
    level = ray_log.level
    ray_log.setLevel(logging.ERROR)  # its start, auth and result-file notices
    start, t0 = time.time(), time.perf_counter()
    with sides.env(MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME=None), bench.quiet():
        ray.init(num_cpus=max(1, threads), include_dashboard=False, log_to_driver=False,
                 _temp_dir=session, logging_level=logging.ERROR,
                 runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": uri,
                                           "OMP_NUM_THREADS": str(threads)}})
        try:
            tuner = tune.Tuner(
                tune.with_parameters(trainable, train=setup["train"], evals=setup["evals"]),
                param_space={"learning_rate": tune.loguniform(setup["lr_min"], setup["lr_max"])},
                tune_config=tune.TuneConfig(
                    metric="eval_loss", mode="min", num_samples=setup["configs"],
                    max_concurrent_trials=1, reuse_actors=True, time_budget_s=timeout,
                    search_alg=BasicVariantGenerator(random_state=0),  # random, seeded
                    scheduler=ASHAScheduler(time_attr="training_iteration",
                                            max_t=setup["chunks"], grace_period=1,
                                            reduction_factor=setup["eta"])),
                run_config=tune.RunConfig(storage_path=f"{out}/ray", verbose=0))
            results = tuner.fit()
        finally:
            wall = time.perf_counter() - t0
            ray.shutdown()
            shutil.rmtree(session, ignore_errors=True)
            ray_log.setLevel(level)
    trials = [r for r in results if r.metrics]
    done = [r for r in trials if r.metrics.get("step") == steps]
    outcome = PeerOutcome("ray-asha", True, wall=wall, trials=len(trials),
                          pruned=len(trials) - len(done))
    if done:
        best = min(done, key=lambda r: r.metrics["eval_loss"])
        outcome.best_loss = float(best.metrics["eval_loss"])
        outcome.best_lr = float(best.config["learning_rate"])
        outcome.time_to_best = best.metrics["wall"] - start
    return outcome


def run_peers(bench: ModuleType, setup: dict[str, Any], work: str, timeout: float,
              sides: ModuleType) -> list[PeerOutcome]:
    outcomes = []
    for name, fn in (("hf-optuna", hf_optuna), ("ray-asha", ray_asha)):
        folder = tempfile.mkdtemp(prefix=f"{name}-", dir=work)
        try:
            with bench.warnings_off():
                outcomes.append(fn(bench, sides, setup, folder, timeout))
        except Exception as err:  # noqa: BLE001 - a peer that breaks is reported, not fatal
            outcomes.append(PeerOutcome(name, False, f"failed: {type(err).__name__}: "
                                                     f"{str(err)[:300]}"))
        finally:
            sides.cleanup(folder)
    return outcomes


def print_peers(peers: list[PeerOutcome], rf: dict[str, Any], setup: dict[str, Any]) -> None:
    """``rf``: policy name -> its RF figures (``wall``, ``time_to_best``, ``best_loss``)."""
    print(f"  peers ({setup['configs']} trials each, one repetition, report_to="
          f"{setup['report_to']}):")
    for p in peers:
        if not p.available:
            print(f"    {p.name:<10} skipped: {p.note}")
            continue
        if p.best_loss is None:
            print(f"    {p.name:<10} {p.wall:8.1f} s, {p.trials} trials ({p.pruned} stopped): "
                  "no trial completed")
            continue
        print(f"    {p.name:<10} {p.wall:8.1f} s in all, {p.trials} trials ({p.pruned} "
              f"stopped); its best: lr {p.best_lr:.3g}, eval_loss {p.best_loss:.4f}, "
              f"{p.time_to_best:.1f} s after its start")
        for policy, figures in rf.items():
            if figures.get("best_loss") is None:
                continue
            ours = figures["time_to_best"]
            print(f"      vs RF {policy:<9}: time to best {p.time_to_best:.1f} s vs ours "
                  f"{ours:.1f} s ({p.time_to_best / ours:.2f}x ours); best eval_loss "
                  f"{p.best_loss:.4f} vs ours {figures['best_loss']:.4f} (ours - theirs "
                  f"{figures['best_loss'] - p.best_loss:+.4f})")
