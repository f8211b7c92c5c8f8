"""Compare reward-model configs at once: 2 learning rates x 2 LoRA ranks, chunk by chunk.

    HF_HUB_OFFLINE=1 python examples/reward_multi_config.py       # the tiny model, on a CPU
    python examples/reward_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset trl-lib/ultrafeedback_binarized --rows 2000     # a real model, on a GPU

A reward model is a sequence classifier: the base model loads once as a one-label
``AutoModelForSequenceClassification`` (its new score head drawn from the seed, as in TRL), and
each run trains its own LoRA adapter and its own copy of the score head (``task_type="SEQ_CLS"``
makes the head a ``modules_to_save``). Rows: ``chosen`` and ``rejected`` (the prompt inside
each, or a ``prompt`` column). The runs are ranked by ``eval_accuracy``: how often ``chosen``
scores above ``rejected`` on held-out pairs (higher is better).
"""

from __future__ import annotations

from _common import command_line, device_kwargs, lora, print_ranking, splits

from trl_rapidfire import List, RFRewardConfig, RFRewardTrainer
from trl_rapidfire.testing import make_reward_dataset


def main(argv: list[str] | None = None) -> RFRewardTrainer:
    args = command_line(__doc__, argv, rows=60)
    train, held_out = splits(args, make_reward_dataset,
                             ["prompt", "chosen", "rejected"], ["chosen", "rejected"])
    trainer = RFRewardTrainer(
        model=args.model,  # loaded once, as a sequence classifier
        args=RFRewardConfig(
            output_dir=args.output_dir,
            learning_rate=List([3e-3, 3e-4] if args.tiny else [1e-4, 2e-5]),  # a knob
            per_device_train_batch_size=4,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",
            metric_for_best_model="eval_accuracy",
            logging_steps=2,
            **device_kwargs(args),
        ),
        train_dataset=train,
        eval_dataset=held_out,
        peft_config=List([lora(args, r, task_type="SEQ_CLS") for r in (4, 16)]),  # a knob
    )
    trainer.train()  # 2 x 2 = 4 runs
    print_ranking(trainer)
    return trainer


if __name__ == "__main__":
    main()
