"""Compare DPO configs at once: 2 betas x 2 loss types, LoRA, trained chunk by chunk.

    HF_HUB_OFFLINE=1 python examples/dpo_multi_config.py          # the tiny model, on a CPU
    python examples/dpo_multi_config.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset trl-lib/ultrafeedback_binarized --rows 1000     # a real model, on a GPU

With LoRA and no ``ref_model``, the reference is the shared base model with the adapters off,
as in a plain DPOTrainer: the 4 runs hold one base model, no reference copy. Rows: ``prompt``
(optional), ``chosen``, ``rejected``. DPO's loss differs in scale across loss types and its
reward margins scale with beta, so the runs are ranked by how often the implicit reward puts
``chosen`` above ``rejected`` on held-out pairs (``eval_rewards/accuracies``, higher is better).
"""

from __future__ import annotations

from _common import command_line, device_kwargs, lora, print_ranking, splits

from trl_rapidfire import List, RFDPOConfig, RFDPOTrainer
from trl_rapidfire.testing import make_dpo_dataset


def main(argv: list[str] | None = None) -> RFDPOTrainer:
    args = command_line(__doc__, argv, rows=60)
    train, held_out = splits(args, lambda n: make_dpo_dataset(n, conversational=True),
                             ["prompt", "chosen", "rejected"], ["chosen", "rejected"])
    trainer = RFDPOTrainer(
        model=args.model,  # no ref_model: the reference is the base model, adapters off
        args=RFDPOConfig(
            output_dir=args.output_dir,
            beta=List([0.1, 0.5]),  # knobs: 2 x 2 = 4 runs
            loss_type=List(["sigmoid", "ipo"]),
            learning_rate=2e-2 if args.tiny else 5e-5,
            per_device_train_batch_size=4,
            num_train_epochs=1,
            num_chunks=args.num_chunks,
            eval_strategy="chunk",
            metric_for_best_model="eval_rewards/accuracies",  # comparable across the knobs
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
