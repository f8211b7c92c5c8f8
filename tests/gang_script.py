"""An experiment with FSDP runs (trained by a gang of all workers) and single-device runs, for
the multi-process gang tests, and the plain-TRL references they are compared with.

    accelerate launch --multi_gpu --num_processes 2 ... tests/gang_script.py rf OUTPUT_DIR
    accelerate launch --multi_gpu --num_processes 2 ... tests/gang_script.py plain OUT LR FSDP

``rf``: one RFSFTTrainer, ``fsdp`` a knob (on, off) x 2 learning rates = 4 runs, 3 chunks.
``RF_TEST_KILL=<run>:<step>`` kills the whole launch (``kill -9`` of its process group) when
that run begins that step, mid-chunk. ``RF_TEST_STOP=<run>:<step>`` stops that run from the
script when it begins that step (the stop applies at its next chunk boundary), and resumes it
in a second ``train()``. ``RF_TEST_CLONE=<run>:<step>`` asks for warm clones of that run then
and prints digests of every gang run's state at every step. ``RF_TEST_STATE_DICT`` sets
``fsdp_config["state_dict_type"]`` (how checkpoints hold weights and moments).
``RF_TEST_THEN_SINGLE=1`` runs a second experiment afterwards in the same launch, in
``OUTPUT_DIR-next``: the two learning rates without fsdp.

The ``rf`` and ``plain`` modes first call ``trl_rapidfire.testing.fsdp_on_cpu()``: accelerate
shards FSDP runs on CPU as it does on GPUs (FSDP2, gloo), so the gang runs and their references
train sharded.

``user-plain OUT`` / ``user-rf OUT``: a user's script on a CPU launch, without
``fsdp_on_cpu()`` (see ``user()``).

``plain``: one plain SFTTrainer with that learning rate, with or without fsdp (1 = on), the
same settings otherwise; under the launch when fsdp is on (the gang's reference), alone when
it is off. The final adapter goes to ``OUT/final``.
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import TrainerCallback

LEARNING_RATES = [1e-3, 3e-3]
FSDP = "full_shard auto_wrap"
FSDP_CONFIG = {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
               # how boundary checkpoints hold the weights and moments: gathered or per shard
               "state_dict_type": os.environ.get("RF_TEST_STATE_DICT", "FULL_STATE_DICT")}


def _common() -> dict:
    from trl_rapidfire.testing import cpu_training_kwargs

    return dict(cpu_training_kwargs(), use_cpu=True, per_device_train_batch_size=4,
                num_train_epochs=1, logging_steps=1, seed=7, report_to="none",
                lr_scheduler_type="linear", warmup_steps=2)


class OpsAt(TrainerCallback):
    """Asks the experiment for ops on ``run`` when it begins ``step`` (from the script, as a
    person would: every worker asks, the first applies them at the run's next boundary).
    ``ask(trainer, run)`` queues them."""

    trainer = None

    def __init__(self, run: str, step: int, ask) -> None:
        self.run, self.step, self.ask, self.done = run, step, ask, False

    def on_step_begin(self, args, state, control, **kwargs):
        if args.output_dir.endswith(self.run) and state.global_step == self.step \
                and not self.done:
            self.done = True
            self.ask(OpsAt.trainer, self.run)


def _stop(trainer, run):
    trainer.stop(run)


def _clone(trainer, run):
    trainer.clone(run, {"learning_rate": 2e-3}, warm=True)
    trainer.clone(run, {"fsdp": ""}, warm=True)  # refused: not a gang like its parent


def _say(line: str) -> None:
    # One write per line: two processes share the pipe, and print() writes its parts apart.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class ReportSharding(TrainerCallback):
    """Prints, once per run and process, whether the run's trainable weights are FSDP shards
    (``DTensor``) or whole tensors, so the tests can tell sharded training from DDP."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        run = os.path.basename(args.output_dir)
        if run not in self.seen and model is not None:
            self.seen.add(run)
            kinds = {type(p).__name__ for p in model.parameters() if p.requires_grad}
            _say(f"weights of {run}: {sorted(kinds)}")


class ReportState(TrainerCallback):
    """Prints a digest of each gang run's gathered trainable weights and Adam moments, and its
    learning rate, at the start of every step (every member gathers: a collective)."""

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        import hashlib

        from torch.distributed.tensor import DTensor

        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not params or not isinstance(params[0][1], DTensor):
            return
        whole = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach()  # noqa: E731
        weights, moments = hashlib.sha256(), hashlib.sha256()
        for name, p in params:
            weights.update(name.encode() + whole(p).contiguous().numpy().tobytes())
            for key in ("exp_avg", "exp_avg_sq"):
                if key in optimizer.state.get(p, {}):
                    moments.update(whole(optimizer.state[p][key]).contiguous().numpy().tobytes())
        lr = optimizer.param_groups[0]["lr"]
        _say(f"state of {os.path.basename(args.output_dir)} at step {state.global_step}: "
             f"weights {weights.hexdigest()[:16]} moments {moments.hexdigest()[:16]} lr {lr:g}")


def rf(output_dir: str) -> None:
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import make_sft_dataset, tiny_lora_config, tiny_model_path

    config = RFSFTConfig(output_dir=output_dir, learning_rate=List(LEARNING_RATES),
                         fsdp=List([FSDP, ""]), fsdp_config=FSDP_CONFIG, num_chunks=3,
                         **_common())
    callbacks: list = [ReportSharding()]
    stop = os.environ.get("RF_TEST_STOP")
    if stop:
        stop_run, stop_step = stop.split(":")
        callbacks.append(OpsAt(stop_run, int(stop_step), _stop))
    clone = os.environ.get("RF_TEST_CLONE")
    if clone:
        clone_run, clone_step = clone.split(":")
        callbacks += [OpsAt(clone_run, int(clone_step), _clone), ReportState()]
    if os.environ.get("RF_TEST_KILL"):
        from experiment_script import KillAt

        run, step = os.environ["RF_TEST_KILL"].split(":")
        callbacks.append(KillAt(run, int(step)))
    trainer = RFSFTTrainer(model=tiny_model_path(), args=config,
                           train_dataset=make_sft_dataset(48, seed=1),
                           peft_config=tiny_lora_config(r=4), callbacks=callbacks)
    OpsAt.trainer = trainer
    if stop:
        trainer.train()
        _say(f"after stop: { {r.name: (r.status.value, r.global_step) for r in trainer.runs} }")
        trainer.resume(stop_run)
    trainer.train()
    _say(str({r.name: (r.knobs, r.status.value, r.global_step) for r in trainer.runs}))
    if os.environ.get("RF_TEST_THEN_SINGLE"):
        # The next experiment of the same launch, single-device runs only: none of the gang's
        # world (its process group, its FSDP plugin) may reach them.
        config = RFSFTConfig(output_dir=f"{output_dir}-next", learning_rate=List(LEARNING_RATES),
                             num_chunks=2, **_common())
        after = RFSFTTrainer(model=tiny_model_path(), args=config,
                             train_dataset=make_sft_dataset(48, seed=1),
                             peft_config=tiny_lora_config(r=4), callbacks=[ReportSharding()])
        after.train()
        _say("next: " + str({r.name: (r.status.value, r.global_step) for r in after.runs}))


def user(mode: str, output_dir: str) -> None:
    """What a user's script does on a CPU launch, without ``fsdp_on_cpu()``: the settings
    plain TRL needs there (``use_cpu``, gloo); accelerate then trains FSDP runs data-parallel.
    ``user-plain``: one SFTTrainer with fsdp; ``user-rf``: fsdp a knob (on, off)."""
    from trl_rapidfire.testing import make_sft_dataset, tiny_lora_config, tiny_model_path

    settings = dict(_common(), fsdp_config=FSDP_CONFIG, ddp_backend="gloo", max_steps=3)
    settings.pop("num_train_epochs")
    if mode == "user-plain":
        from trl import SFTConfig, SFTTrainer

        trainer = SFTTrainer(model=tiny_model_path(),
                             args=SFTConfig(output_dir=output_dir, fsdp=FSDP,
                                            learning_rate=LEARNING_RATES[0], **settings),
                             train_dataset=make_sft_dataset(48, seed=1),
                             peft_config=tiny_lora_config(r=4))
        trainer.train()
        trainer.save_model(f"{output_dir}/final")
        _say(f"plain wrapped in {type(trainer.model_wrapped).__name__}")
        return
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer

    trainer = RFSFTTrainer(model=tiny_model_path(),
                           args=RFSFTConfig(output_dir=output_dir, fsdp=List([FSDP, ""]),
                                            learning_rate=LEARNING_RATES[0], num_chunks=2,
                                            **settings),
                           train_dataset=make_sft_dataset(48, seed=1),
                           peft_config=tiny_lora_config(r=4))
    trainer.train()
    _say(str({r.name: (r.status.value, r.global_step) for r in trainer.runs}))
    _say(f"run-0 wrapped in {type(trainer.run_trainer('run-0').model_wrapped).__name__}")


def plain(output_dir: str, lr: float, fsdp: bool) -> None:
    from trl import SFTConfig, SFTTrainer

    from trl_rapidfire.testing import make_sft_dataset, tiny_lora_config, tiny_model_path

    extra = dict(fsdp=FSDP, fsdp_config=FSDP_CONFIG, ddp_backend="gloo") if fsdp else {}
    trainer = SFTTrainer(model=tiny_model_path(),
                         args=SFTConfig(output_dir=output_dir, learning_rate=lr, **_common(),
                                        **extra),
                         train_dataset=make_sft_dataset(48, seed=1),
                         peft_config=tiny_lora_config(r=4))
    trainer.train()
    trainer.save_model(f"{output_dir}/final")


if __name__ == "__main__":
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks of a stuck test
    torch.set_num_threads(1)
    from trl_rapidfire.testing import fsdp_on_cpu

    if sys.argv[1].startswith("user-"):
        user(sys.argv[1], sys.argv[2])  # as a user's script: no fsdp_on_cpu()
    elif sys.argv[1] == "rf":
        fsdp_on_cpu()  # shard on CPU as on GPUs (the references too)
        rf(sys.argv[2])
    else:
        fsdp_on_cpu()
        plain(sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1")
    if torch.distributed.is_initialized():
        # Left to the interpreter's exit, gloo's threads now and then abort the process
        # ("terminate called without an active exception", seen once in CI).
        torch.distributed.destroy_process_group()
