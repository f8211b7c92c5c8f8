"""A streamed eval set (an ``IterableDataset``) evaluates as in TRL: it has no length, so no
sampler is asked of it, and the eval dataloader is made anew each time as TRL makes it."""

from __future__ import annotations

from trl import GRPOConfig, GRPOTrainer

from trl_rapidfire import RFGRPOConfig, RFGRPOTrainer
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_grpo_dataset,
    reward_short,
    tiny_lora_config,
    tiny_model_path,
)

COMMON = dict(cpu_training_kwargs(), per_device_train_batch_size=4, per_device_eval_batch_size=4,
              num_generations=4, max_completion_length=4, max_steps=1, logging_steps=1)


def test_a_streamed_eval_set_evaluates_as_plain_grpo(tmp_path):
    train = make_grpo_dataset(8)
    stream = make_grpo_dataset(4, seed=1).to_iterable_dataset()
    kwargs = dict(model=tiny_model_path(), reward_funcs=[reward_short], train_dataset=train,
                  eval_dataset=stream, peft_config=tiny_lora_config(r=4))
    rf = RFGRPOTrainer(args=RFGRPOConfig(output_dir=str(tmp_path / "rf"), **COMMON), **kwargs)
    got = rf.evaluate()  # was: TypeError: object of type 'IterableDataset' has no len()
    plain = GRPOTrainer(args=GRPOConfig(output_dir=str(tmp_path / "plain"), **COMMON), **kwargs)
    want = plain.evaluate()

    def untimed(metrics):
        return {k: v for k, v in metrics.items() if "time" not in k and "per_second" not in k}

    assert untimed(got) == untimed(want)
    assert "eval_reward" in got
