"""Compare SFT configs at once: 2 learning rates x 2 LoRA ranks, trained chunk by chunk.

    HF_HUB_OFFLINE=1 python examples/sft_multi_config.py          # the tiny model, on a CPU
    python examples/sft_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset trl-lib/Capybara --rows 2000                    # a real model, on a GPU

The 4 runs share one base model (each trains its own adapter) and take turns chunk by chunk;
every run is evaluated at each chunk end and ends as TRL's SFTTrainer would have trained it
alone. Rows: ``prompt``/``completion``, ``messages`` or ``text``. The runs are ranked by eval
loss (lower is better).
"""

from __future__ import annotations

from _common import command_line, device_kwargs, lora, print_ranking, splits

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import make_sft_dataset


def main(argv: list[str] | None = None) -> RFSFTTrainer:
    args = command_line(__doc__, argv, rows=80)
    train, held_out = splits(args, lambda n: make_sft_dataset(n, kind="prompt_completion"),
                             ["prompt", "completion"], ["messages"], ["text"])
    trainer = RFSFTTrainer(
        model=args.model,
        args=RFSFTConfig(
            output_dir=args.output_dir,
            learning_rate=List([5e-3, 1e-3] if args.tiny else [2e-4, 5e-5]),  # a knob
            lr_scheduler_type="cosine",
            warmup_steps=0.1,  # below 1: a ratio of the total steps
            per_device_train_batch_size=8,
            num_train_epochs=1,
            num_chunks=args.num_chunks,  # runs take turns every 1/num_chunks epoch
            eval_strategy="chunk",  # every run evaluated at every chunk end
            metric_for_best_model="eval_loss",
            logging_steps=2,
            **device_kwargs(args),
        ),
        train_dataset=train,
        eval_dataset=held_out,
        peft_config=List([lora(args, r=4), lora(args, r=16)]),  # a knob of the trainer
    )
    trainer.train()  # 2 x 2 = 4 runs
    print_ranking(trainer)
    return trainer


if __name__ == "__main__":
    main()
