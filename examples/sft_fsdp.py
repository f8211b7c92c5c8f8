"""FSDP runs as knobs: the seed's "lite" (offload on) and "large" (offload off) settings.

An FSDP run is trained by all the workers of the launch together (a gang). Here the FSDP
setting is a knob, beside the learning rate (2 x 2 = 4 gang runs, taking turns by chunks):

* ``lite``: FSDP with parameters offloaded to CPU memory between uses (``cpu_offload``), for
  a model that does not fit on the GPUs even when sharded;
* ``large``: FSDP without offload, for a model that fits once sharded.

Runs without ``fsdp`` in the same experiment would be trained by one worker each (see
``docs/fsdp.md``).

The two FSDP configs are the seed's tutorial settings, written with the keys they had
(``offload_params``, ``sharding_strategy``, ...). trl-rapidfire maps them onto transformers 5's
FSDP2 settings (``cpu_offload``, ``reshard_after_forward``) and says so; the FSDP1-only
performance keys are kept, with a warning that FSDP2 does not read them.

On GPUs, with a real model::

    accelerate launch --num_processes 4 examples/sft_fsdp.py --model meta-llama/Llama-3.1-8B

Offline on a CPU (tiny model). accelerate's FSDP mode is for GPUs: on a CPU it trains
``fsdp`` configs data-parallel, unless ``--shard-on-cpu`` puts it in FSDP mode there too
(``trl_rapidfire.testing.fsdp_on_cpu``; FSDP2 over gloo; the lite runs then keep their
parameters in place, since a CPU has nowhere to offload them to)::

    OMP_NUM_THREADS=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no examples/sft_fsdp.py --shard-on-cpu
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

import torch

# As in the seed's "SFT FSDP Lite" and "SFT FSDP Large" tutorials.
SEED_FSDP_LITE = {
    "backward_prefetch": "backward_pre", "forward_prefetch": True, "use_orig_params": False,
    "cpu_ram_efficient_loading": True, "offload_params": True, "sync_module_states": True,
    "limit_all_gathers": True, "sharding_strategy": "FULL_SHARD",
    "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
}
SEED_FSDP_LARGE = {**SEED_FSDP_LITE, "forward_prefetch": False, "offload_params": False}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="Hub name or path (default: the tiny offline model)")
    parser.add_argument("--output-dir", help="experiment folder (default: a temp folder)")
    parser.add_argument("--rows", type=int, default=64, help="generated training rows")
    parser.add_argument("--num-chunks", type=int, default=3)
    parser.add_argument("--shard-on-cpu", action="store_true",
                        help="shard with FSDP on a CPU too (accelerate does so only on GPUs)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Any:
    from peft import LoraConfig

    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.runtime.workers import current_worker
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        fsdp_on_cpu,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    args = parse_args(argv)
    lite = SEED_FSDP_LITE
    if args.shard_on_cpu:
        fsdp_on_cpu()
        lite = {**SEED_FSDP_LITE, "offload_params": False}  # torch offloads to CPU from GPUs
    tiny = args.model is None
    device_kwargs: dict[str, Any] = (
        dict(cpu_training_kwargs(), use_cpu=True) if tiny
        else {"bf16": torch.cuda.is_bf16_supported(), "report_to": "none"}
    )
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="rapidfire-fsdp-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # FSDP1-only keys; the mapping is shown
        config = RFSFTConfig(
            output_dir=output_dir,
            learning_rate=List([3e-3, 1e-3] if tiny else [2e-4, 5e-5]),
            fsdp="full_shard auto_wrap",
            fsdp_config=List([lite, SEED_FSDP_LARGE]),   # the knob: lite vs large
            per_device_train_batch_size=4, num_train_epochs=1, num_chunks=args.num_chunks,
            seed=0, **device_kwargs,
        )
    first = current_worker().rank == 0  # every worker runs this script; one reports
    for name, value in zip(("lite", "large"), config.knobs["fsdp_config"].values):
        if first:
            print(f"{name}: fsdp_config as transformers 5 gets it: {value}", flush=True)
    trainer = RFSFTTrainer(
        model=tiny_model_path() if tiny else args.model, args=config,
        train_dataset=make_sft_dataset(args.rows, seed=1),
        peft_config=tiny_lora_config(r=4) if tiny else LoraConfig(
            r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.train()
    if first:
        print(f"\n{'run':6} {'fsdp':6} {'learning_rate':>13} {'steps':>5} {'train_loss':>10}")
        for run in trainer.runs:
            fsdp = "lite" if run.knobs["fsdp_config"].get("forward_prefetch") else "large"
            print(f"{run.name:6} {fsdp:6} {run.knobs['learning_rate']:13g} "
                  f"{run.global_step:5d} {run.metrics.get('train_loss', float('nan')):10.4f}")
        print(f"\nadapters in {output_dir}/runs/<run>/final/", flush=True)
    return trainer


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # as torch asks of every distributed script
