"""Trainings that a notebook or script might run one after another in one process, for
``tests/trainers/test_sequential_experiments.py``.

    python tests/sequence_script.py CASE OUTPUT_DIR THREADS

trains one case alone, in a fresh process: the reference the same case must equal, bitwise,
when it runs after other experiments in one process. Each case returns its final trainable
weights by run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback

from trl_rapidfire import List, RFDPOConfig, RFSFTConfig
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_dpo_dataset,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

Weights = dict[str, dict[str, torch.Tensor]]


def _kwargs(bf16: bool = False) -> dict:
    kw = dict(cpu_training_kwargs(), per_device_train_batch_size=4, max_steps=4, logging_steps=1,
              seed=3)
    if bf16:  # a mixed precision other than the next experiment's: process-global in accelerate
        kw.update(bf16=True, use_cpu=True)
    return kw


def _finals(out: Path) -> Weights:
    return {p.parent.parent.name: load_file(p)
            for p in sorted(out.glob("runs/*/final/adapter_model.safetensors"))}


class _Raise(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("this run fails at step 2")


class _Interrupt(TrainerCallback):
    """Ctrl-C at step 2 (what the SIGINT handler does: stop at the next boundary)."""

    trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2 and _Interrupt.trainer is not None:
            _Interrupt.trainer.engine.interrupted = True


def rf_sft_bf16(out: Path) -> Weights:
    from trl_rapidfire import RFSFTTrainer

    RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         **_kwargs(bf16=True)),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
    ).train()
    return _finals(out)


def rf_dpo(out: Path) -> Weights:
    from trl_rapidfire import RFDPOTrainer

    RFDPOTrainer(
        model=tiny_model_path(seed=1),  # another base model
        args=RFDPOConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         **_kwargs()),
        train_dataset=make_dpo_dataset(32),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
    ).train()
    return _finals(out)


def plain_sft(out: Path) -> Weights:
    from trl import SFTConfig, SFTTrainer

    trainer = SFTTrainer(
        model=tiny_model_path(), args=SFTConfig(output_dir=str(out), **_kwargs()),
        train_dataset=make_sft_dataset(32), peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
    )
    trainer.train()
    return {"plain": {n: p.detach().clone() for n, p in trainer.model.named_parameters()
                      if p.requires_grad}}


def rf_fails(out: Path) -> None:
    from trl_rapidfire import RFSFTTrainer
    from trl_rapidfire.engine import RunFailure

    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         **_kwargs(bf16=True)),
        train_dataset=make_sft_dataset(32), peft_config=tiny_lora_config(r=4),
        callbacks=[_Raise()],
    )
    try:
        trainer.train()
    except RunFailure:
        return
    raise AssertionError("every run was meant to fail")


def rf_interrupted(out: Path) -> None:
    from trl_rapidfire import RFSFTTrainer

    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         **_kwargs(bf16=True)),
        train_dataset=make_sft_dataset(32), peft_config=tiny_lora_config(r=4),
        callbacks=[_Interrupt()],
    )
    _Interrupt.trainer = trainer
    try:
        trainer.train()
    except KeyboardInterrupt:
        return
    finally:
        _Interrupt.trainer = None
    raise AssertionError("the experiment was meant to be interrupted")


CASES = {f.__name__: f for f in (rf_sft_bf16, rf_dpo, plain_sft, rf_fails, rf_interrupted)}


def main(case: str, out: str, threads: str) -> None:
    torch.set_num_threads(int(threads))
    weights = CASES[case](Path(out))
    for run, tensors in weights.items():
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(Path(out) / f"reference-{run}.safetensors"))


if __name__ == "__main__":
    main(*sys.argv[1:])
