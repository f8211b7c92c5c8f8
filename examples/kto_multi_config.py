"""Compare KTO configs at once: 2 learning rates x 2 desirable weights, trained chunk by chunk.

    HF_HUB_OFFLINE=1 python examples/kto_multi_config.py          # the tiny model, on a CPU
    python examples/kto_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset trl-lib/kto-mix-14k --rows 1000                 # a real model, on a GPU

KTO learns from unpaired feedback: rows of ``prompt``, ``completion`` and ``label`` (True: a
thumbs-up). With LoRA and no ``ref_model``, the reference is the shared base model with the
adapters off, as in a plain KTOTrainer: the 4 runs hold one base model. The weights scale the
loss, so the runs are ranked by the implicit reward margin on held-out rows (desirable minus
undesirable, ``eval_rewards/margins``, higher is better): comparable at equal ``beta``.
"""

from __future__ import annotations

from _common import command_line, device_kwargs, lora, print_ranking, splits

from trl_rapidfire import List, RFKTOConfig, RFKTOTrainer
from trl_rapidfire.testing import make_kto_dataset


def main(argv: list[str] | None = None) -> RFKTOTrainer:
    args = command_line(__doc__, argv, rows=40)
    train, held_out = splits(args, make_kto_dataset, ["prompt", "completion", "label"])
    trainer = RFKTOTrainer(
        model=args.model,  # no ref_model: the reference is the base model, adapters off
        args=RFKTOConfig(
            output_dir=args.output_dir,
            learning_rate=List([1e-2, 1e-3] if args.tiny else [5e-5, 1e-5]),  # knobs:
            desirable_weight=List([1.0, 1.5]),  # 2 x 2 = 4 runs
            beta=0.1,
            max_length=32 if args.tiny else 1024,
            per_device_train_batch_size=4,  # KL: each prompt with another row's completion
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",
            metric_for_best_model="eval_rewards/margins",
            logging_steps=2,
            **device_kwargs(args),
        ),
        train_dataset=train,
        eval_dataset=held_out,
        peft_config=lora(args, r=8),
    )
    trainer.train()
    print_ranking(trainer)
    return trainer


if __name__ == "__main__":
    main()
