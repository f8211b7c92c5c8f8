"""Compare distillation configs at once: 2 learning rates x 2 LoRA ranks of the student.

    HF_HUB_OFFLINE=1 python examples/distillation_multi_config.py   # the tiny model, on a CPU
    python examples/distillation_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --teacher Qwen/Qwen2.5-1.5B-Instruct --dataset my_prompts.jsonl  # same vocabulary, GPU

On-policy distillation: the student generates completions for each prompt and learns the
teacher's next-token distribution on them. The 4 runs share one student base model (each
trains its own adapter) and one teacher, loaded once (``teacher_model`` may be a knob too:
each distinct teacher is loaded once). The student generates at every optimizer step, so any
step is a whole generation cycle. Rows: ``prompt`` (other columns are ignored). The loss is the
divergence from the teacher, comparable across runs of equal ``beta`` and ``temperature`` (as
here): the runs are ranked by eval loss (lower is better).
"""

from __future__ import annotations

from _common import command_line, device_kwargs, lora, print_ranking, splits

from trl_rapidfire import List, RFDistillationConfig, RFDistillationTrainer
from trl_rapidfire.testing import make_sft_dataset, tiny_teacher_path


def main(argv: list[str] | None = None) -> RFDistillationTrainer:
    args = command_line(__doc__, argv, rows=20,
                        teacher="the teacher's Hub name or path (default: the tiny teacher)")
    train, held_out = splits(args, lambda n: make_sft_dataset(n, kind="prompt_completion"),
                             ["prompt"])
    trainer = RFDistillationTrainer(
        model=args.model,
        teacher_model=args.teacher or tiny_teacher_path(),  # 3 layers, the same vocabulary
        args=RFDistillationConfig(
            output_dir=args.output_dir,
            learning_rate=List([1e-2, 1e-3] if args.tiny else [1e-4, 2e-5]),  # a knob
            beta=0.5,  # 0: forward KL, 1: reverse KL, 0.5: Jensen-Shannon
            temperature=1.0,
            max_completion_length=8 if args.tiny else 256,
            per_device_train_batch_size=4,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",
            metric_for_best_model="eval_loss",
            logging_steps=1,
            **device_kwargs(args),
        ),
        train_dataset=train,
        eval_dataset=held_out,
        peft_config=List([lora(args, r=4), lora(args, r=16)]),  # a knob of the trainer
    )
    trainer.train()  # 2 x 2 = 4 runs
    print_ranking(trainer)
    print(f"\nTeacher loads: {trainer.teacher_loads}")
    return trainer


if __name__ == "__main__":
    main()
