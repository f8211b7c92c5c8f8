"""Quickstart: describe a config group and see the runs trl-rapidfire would train.

    python examples/quickstart.py              # the embedded defaults below
    python examples/quickstart.py --random 6   # random search with 6 draws instead of a grid

Nothing is trained yet: this shows how knobs expand (grid or random search) and checks every
run's config before any training would start. Runs offline on a CPU in a few seconds.
"""

from __future__ import annotations

import argparse

from peft import LoraConfig

from trl_rapidfire import GridSearch, List, RandomSearch, Range, RFSFTConfig
from trl_rapidfire.display import table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, metavar="N", help="random search with N draws")
    args = parser.parse_args()

    lora_small = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                            task_type="CAUSAL_LM")
    lora_large = LoraConfig(r=32, lora_alpha=64, target_modules="all-linear",
                            task_type="CAUSAL_LM")
    config = RFSFTConfig(
        output_dir="outputs/quickstart",
        learning_rate=Range(1e-5, 1e-3, log=True) if args.random else List([2e-4, 1e-5]),
        lr_scheduler_type=List(["linear", "cosine"]),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        warmup_steps=0.1,          # below 1: a ratio of the total steps
        logging_steps=5,
        eval_strategy="chunk",     # evaluate every run at every chunk end
        num_chunks=4,
        bf16=False,                # CPU-friendly; use bf16=True on a recent GPU
        use_cpu=True,
    )
    search = RandomSearch(num_runs=args.random, seed=0) if args.random else GridSearch()
    runs = search.expand(config, peft_config=List([lora_small, lora_large]))

    print(f"{len(runs)} runs from {search!r}; each epoch of each run is cut into "
          f"{config.num_chunks} chunks, and runs take turns chunk by chunk.\n")
    rows = [(r.name, f"{r.config.learning_rate:.2e}", r.config.lr_scheduler_type.value,
             f"r={r.trainer_kwargs['peft_config'].r}") for r in runs]
    print(table(["run", "learning_rate", "scheduler", "lora"], rows))


if __name__ == "__main__":
    main()
