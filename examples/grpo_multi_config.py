"""Compare GRPO configs at once: 2 learning rates x 2 reward sets, trained chunk by chunk.

    HF_HUB_OFFLINE=1 python examples/grpo_multi_config.py         # the tiny model, on a CPU
    python examples/grpo_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset my_questions.jsonl --rows 500                   # a real model, on a GPU

The reward sets are zipped with their weights (not crossed): a verifiable reward (the row's
``answer`` in the completion) plus a weighted brevity reward, against the verifiable reward
alone. Completions are generated once per cycle of ``steps_per_generation`` steps, so every
chunk boundary falls on a whole cycle. Rows: ``prompt`` and ``answer``. The total reward differs
across reward sets, so the runs are ranked by the verifiable reward on held-out prompts.
"""

from __future__ import annotations

from _common import command_line, device_kwargs, lora, print_ranking, splits

from trl_rapidfire import GridSearch, List, RFGRPOConfig, RFGRPOTrainer
from trl_rapidfire.testing import make_grpo_dataset, reward_correct_answer, reward_short


def main(argv: list[str] | None = None) -> RFGRPOTrainer:
    args = command_line(__doc__, argv, rows=20)
    train, held_out = splits(args, make_grpo_dataset, ["prompt", "answer"])
    trainer = RFGRPOTrainer(
        model=args.model,
        reward_funcs=List([[reward_correct_answer, reward_short], [reward_correct_answer]]),
        args=RFGRPOConfig(
            output_dir=args.output_dir,
            learning_rate=List([1e-2, 3e-3] if args.tiny else [2e-5, 5e-6]),
            reward_weights=List([[1.0, 0.5], [1.0]]),  # zipped with reward_funcs, below
            num_generations=4,
            steps_per_generation=2,  # a generation cycle: 2 steps
            max_completion_length=8 if args.tiny else 256,
            per_device_train_batch_size=4,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",  # evaluation generates too
            metric_for_best_model="eval_rewards/reward_correct_answer/mean",
            logging_steps=2,
            **device_kwargs(args),
        ),
        train_dataset=train,
        eval_dataset=held_out,
        peft_config=lora(args, r=8),
        search=GridSearch(zip=[("reward_funcs", "reward_weights")]),  # 2 x 2 = 4 runs
    )
    trainer.train()
    print_ranking(trainer)
    return trainer


if __name__ == "__main__":
    main()
