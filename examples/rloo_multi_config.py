"""Compare RLOO configs at once: 2 learning rates x 2 KL coefficients, trained chunk by chunk.

    HF_HUB_OFFLINE=1 python examples/rloo_multi_config.py         # the tiny model, on a CPU
    python examples/rloo_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset my_questions.jsonl --rows 500                   # a real model, on a GPU

RLOO samples ``num_generations`` completions per prompt and scores each against the mean of
the others (leave one out). Each run generates once per cycle of ``generation_batch_size``
completions, so every chunk boundary falls on a whole cycle. With ``beta > 0`` the KL reference
is the shared base model with the adapters off. Rows: ``prompt`` and ``answer``; the reward
functions are shared by the runs (they may be a knob, as in grpo_multi_config.py). The rewards
do not depend on beta, so the runs are ranked by the weighted reward on held-out prompts.
"""

from __future__ import annotations

from _common import command_line, device_kwargs, lora, print_ranking, splits

from trl_rapidfire import List, RFRLOOConfig, RFRLOOTrainer
from trl_rapidfire.testing import make_grpo_dataset, reward_correct_answer, reward_short


def main(argv: list[str] | None = None) -> RFRLOOTrainer:
    args = command_line(__doc__, argv, rows=20)
    train, held_out = splits(args, make_grpo_dataset, ["prompt", "answer"])
    trainer = RFRLOOTrainer(
        model=args.model,
        reward_funcs=[reward_correct_answer, reward_short],
        args=RFRLOOConfig(
            output_dir=args.output_dir,
            learning_rate=List([1e-2, 3e-3] if args.tiny else [2e-5, 5e-6]),  # knobs:
            beta=List([0.0, 0.05]),  # 2 x 2 = 4 runs
            reward_weights=[1.0, 0.5],
            num_generations=2,
            generation_batch_size=8,  # a generation cycle: 8 completions, 2 steps of 4
            max_completion_length=8 if args.tiny else 256,
            per_device_train_batch_size=4,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",  # evaluation generates too
            metric_for_best_model="eval_reward",
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
