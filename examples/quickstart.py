"""Quickstart: a config group of 8 runs, trained chunk by chunk, then the dashboard.

    python examples/quickstart.py              # train the embedded defaults (~1 min on 2 CPUs)
    python examples/quickstart.py --dry-run    # only show the runs it would train
    python examples/quickstart.py --random 6   # random search with 6 draws instead of a grid

Runs offline on a CPU: the model is the tiny 2-layer Llama built locally by
``trl_rapidfire.testing`` and the data are generated question/answer pairs. Every run is
tracked in MLflow (``./mlflow.db`` unless ``MLFLOW_TRACKING_URI`` says otherwise); at the end
the script prints the runs, the best one, and the command that opens the dashboard, where
each run is an MLflow run whose tags steer it. On a GPU with a real model, pass ``--model``.

The experiment's folder is ``./outputs/quickstart`` (``--output-dir`` for another), the same on
every run of the script: running it again continues the experiment where it stopped (a Ctrl-C,
a crash) and trains nothing it finished. To start over, delete the folder or pass a new one.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from peft import LoraConfig

from trl_rapidfire import GridSearch, List, RandomSearch, Range, RFSFTConfig
from trl_rapidfire.reports.display import table

# Relative to where the script is run (as ./mlflow.db is): a fixed folder, so that a second run
# continues the first instead of starting a new experiment.
OUTPUT_DIR = "outputs/quickstart"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, metavar="N", help="random search with N draws")
    parser.add_argument("--dry-run", action="store_true", help="show the runs, train nothing")
    parser.add_argument("--model", help="a Hub name or path (default: the tiny offline model)")
    parser.add_argument("--output-dir", default=OUTPUT_DIR,
                        help=f"experiment folder (default: ./{OUTPUT_DIR}; a re-run continues it)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Any:
    args = parse_args(argv)
    tiny = args.model is None
    # Target modules every Llama-like model has; the tiny model needs large learning rates
    # (it starts from random weights), a pretrained one the usual LoRA range.
    lora_small = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                            task_type="CAUSAL_LM")
    lora_large = LoraConfig(r=32, lora_alpha=64, target_modules="all-linear",
                            task_type="CAUSAL_LM")
    lrs = [3e-3, 3e-4] if tiny else [2e-4, 1e-5]
    config = RFSFTConfig(
        output_dir=args.output_dir,
        learning_rate=(Range(min(lrs), max(lrs), log=True) if args.random else List(lrs)),
        lr_scheduler_type=List(["linear", "cosine"]),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        warmup_steps=0.1,          # below 1: a ratio of the total steps
        logging_steps=2,
        eval_strategy="chunk",     # evaluate every run at every chunk end
        num_chunks=4,
        report_to="mlflow",        # every run an MLflow run; its tags are its controls
        bf16=False,                # CPU-friendly; use bf16=True on a recent GPU
        use_cpu=tiny,
    )
    search = RandomSearch(num_runs=args.random, seed=0) if args.random else GridSearch()
    loras = List([lora_small, lora_large])
    runs = search.expand(config, peft_config=loras)
    print(f"{len(runs)} runs from {search!r}; each epoch of each run is cut into "
          f"{config.num_chunks} chunks, and runs take turns chunk by chunk.\n")
    rows = [(r.name, f"{r.config.learning_rate:.2e}", r.config.lr_scheduler_type.value,
             f"r={r.trainer_kwargs['peft_config'].r}") for r in runs]
    if args.dry_run:  # training shows the same runs in its live table
        print(table(["run", "learning_rate", "scheduler", "lora"], rows), flush=True)
        return runs

    from trl_rapidfire import RFSFTTrainer  # imports TRL's trainer stack: a few seconds
    from trl_rapidfire.testing import make_sft_dataset, tiny_model_path

    trainer = RFSFTTrainer(
        model=tiny_model_path() if tiny else args.model,
        args=config,
        train_dataset=make_sft_dataset(48, seed=0, kind="prompt_completion"),
        eval_dataset=make_sft_dataset(16, seed=1, kind="prompt_completion"),
        peft_config=loras,
        search=search,
    )
    trainer.train()
    best = trainer.best_run
    print(f"\nBest run: {best.name} (eval_loss {best.metrics['eval_loss']:.4f}); its adapter "
          f"is in {best.final_dir}")
    print(f"Turns:     {len(trainer.schedule)} chunks, the runs taking turns; the order is in "
          f"{config.output_dir}/schedule.csv")
    tracker = trainer.engine.tracker
    if tracker is not None:  # MLflow's UI on this experiment's runs table (Model training view)
        from trl_rapidfire.client.dashboard import runs_url

        url = runs_url("http://127.0.0.1:5000", tracker.experiment_id)
        print(f"Dashboard: trl-rapidfire dashboard   then open {url}")
    print(f"Report:    trl-rapidfire report {config.output_dir} --out report")
    print("Again:     the same command continues this experiment (nothing finished is trained "
          f"again);\n           to start over, delete {config.output_dir} or pass --output-dir NEW")
    return trainer


if __name__ == "__main__":
    main()
