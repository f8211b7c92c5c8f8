"""One config, no knobs: what a user who only swaps the imports pays against plain TRL.

For each trainer of ``--trainers`` (SFT, DPO, GRPO) and each tracking mode of ``--tracking``
(``none``; ``mlflow``: a new sqlite store a side, copied from one migrated once before the
clocks start, as ``time_to_best.py`` does), one config on the tiny offline Llama of
``trl_rapidfire.testing`` with LoRA (rank 8, q_proj and v_proj), ``--rows`` rows (SFT batch
8, DPO batch 4, GRPO batch 4 with 4 generations of 8 tokens), TRL's defaults otherwise as
TRL's own tests leave them (``bf16`` off for the CPU; ``--lean``: ``cpu_training_kwargs``, no
checkpoint and no progress bar), is constructed and trained by:

* **A, plain TRL**: ``SFTTrainer(model=<path>, args=SFTConfig(...), ...)`` then ``train()``;
* **B, trl-rapidfire**: ``RFSFTTrainer(model=<path>, args=RFSFTConfig(...), ...)`` with the
  same arguments (nothing turned into a knob) then ``train()``.

Timed: construction + ``train()``, each side's best of ``--repeats`` pairs (A B A B, one
process, after an untimed warm-up of both). Printed per (trainer, tracking): both sides'
construct and train, the ratio B / A (the target: at most 1.1), and where B's extra time went:
the engine's own loop outside the run's turn (``engine.stats.switching``), and a profile of
the repetition (``--profile``: trl_rapidfire's functions by their own time plus what they call
outside TRL/transformers/torch, the first 15).

Usage::

    python benchmarks/one_config.py                     # SFT DPO GRPO x none mlflow, 3 pairs
    python benchmarks/one_config.py --quick             # SFT, none, 1 pair: a smoke test
    python benchmarks/one_config.py --trainers sft --tracking none --repeats 5 --profile
    python benchmarks/one_config.py --fresh             # each side in a fresh process

In one process, plain TRL's ``train()`` pays accelerate's full ``gc.collect()`` over the
process's whole heap (0.3-0.6 s with torch, transformers, TRL, datasets and MLflow loaded);
trl-rapidfire freezes what the experiment holds first, so its collection is short. A script
that trains one config in a fresh process has a smaller heap: ``--fresh`` measures that case,
with each side's imports timed apart.

Runs offline on CPU, one torch thread (``--threads``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class Timing:
    construct: float
    train: float
    switching: float = 0.0
    imports: float = 0.0  # --fresh: the side's imports in its own process

    @property
    def total(self) -> float:
        return self.construct + self.train


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def workload(kind: str, rows: int, lean: bool = False
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trainer's keyword arguments (besides model and args) and the config's values:
    TRL's defaults as a TRL test leaves them (only ``bf16`` off, which a CPU needs), or with
    ``lean`` the flags of ``cpu_training_kwargs`` (no checkpoint, no progress bar, ...)."""
    from trl_rapidfire import testing as t

    base = t.cpu_training_kwargs() if lean else {"bf16": False}
    common = dict(base, logging_steps=1, num_train_epochs=1, learning_rate=1e-3)
    lora = t.tiny_lora_config(r=8)
    if kind == "sft":
        return ({"train_dataset": t.make_sft_dataset(rows), "peft_config": lora},
                dict(common, per_device_train_batch_size=8))
    if kind == "dpo":
        return ({"train_dataset": t.make_dpo_dataset(rows), "peft_config": lora},
                dict(common, per_device_train_batch_size=4))
    if kind == "grpo":
        return ({"train_dataset": t.make_grpo_dataset(rows), "peft_config": lora,
                 "reward_funcs": [t.reward_short]},
                dict(common, per_device_train_batch_size=4, num_generations=4,
                     max_completion_length=8, steps_per_generation=2))
    raise ValueError(f"unknown trainer {kind!r}: sft, dpo or grpo")


def classes(kind: str, rf: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    import trl

    import trl_rapidfire

    name = {"sft": "SFT", "dpo": "DPO", "grpo": "GRPO"}[kind]
    if rf:
        return (getattr(trl_rapidfire, f"RF{name}Trainer"),
                getattr(trl_rapidfire, f"RF{name}Config"))
    return getattr(trl, f"{name}Trainer"), getattr(trl, f"{name}Config")


class Stores:
    """A new sqlite MLflow store per side and repetition, copied from one migrated once."""

    def __init__(self, root: str) -> None:
        import mlflow

        self.root, self.count = root, 0
        self.template = os.path.join(root, "template.db")
        with quiet():
            mlflow.MlflowClient(f"sqlite:///{self.template}").search_experiments()

    def fresh(self) -> str:
        self.count += 1
        path = os.path.join(self.root, f"store-{self.count}.db")
        shutil.copyfile(self.template, path)
        return f"sqlite:///{path}"


def run_side(kind: str, rf: bool, rows: int, tracking: str, out: str,
             stores: Stores | None, profile: cProfile.Profile | None = None,
             lean: bool = False) -> Timing:
    trainer_cls, config_cls = classes(kind, rf)
    kwargs, values = workload(kind, rows, lean)
    from trl_rapidfire.testing import tiny_model_path

    values = dict(values, report_to=tracking, output_dir=out)
    if stores is not None:
        os.environ["MLFLOW_TRACKING_URI"] = stores.fresh()
        os.environ["MLFLOW_EXPERIMENT_NAME"] = f"one-config-{stores.count}"
    with quiet():
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        trainer = trainer_cls(model=tiny_model_path(), args=config_cls(**values), **kwargs)
        t1 = time.perf_counter()
        trainer.train()
        t2 = time.perf_counter()
        if profile is not None:
            profile.disable()
    switching = trainer.engine.stats.switching if rf else 0.0
    del trainer
    return Timing(t1 - t0, t2 - t1, switching)


def child(args: argparse.Namespace) -> int:
    """One side in this (fresh) process: imports, then construct + train; JSON on stdout."""
    kind, which, tracking, out = args.child
    started = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    classes(kind, which == "rf")
    workload(kind, 8, args.lean)  # the testing helpers and datasets imported
    imports = time.perf_counter() - started
    timing = run_side(kind, which == "rf", args.rows, tracking, out, None, None, args.lean)
    print(json.dumps({"construct": timing.construct, "train": timing.train,
                      "switching": timing.switching, "imports": imports}))
    return 0


def in_fresh_process(kind: str, rf: bool, tracking: str, out: str, args: argparse.Namespace,
                     stores: Stores | None) -> Timing:
    env = dict(os.environ)
    if stores is not None:
        env["MLFLOW_TRACKING_URI"] = stores.fresh()
        env["MLFLOW_EXPERIMENT_NAME"] = f"one-config-{stores.count}"
    command = [sys.executable, __file__, "--child", kind, "rf" if rf else "plain", tracking,
               out, "--rows", str(args.rows), "--threads", str(args.threads)]
    if args.lean:
        command.append("--lean")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} side failed:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return Timing(figures["construct"], figures["train"], figures["switching"],
                  figures["imports"])


def ours(profile: cProfile.Profile, top: int = 15) -> list[str]:
    """trl_rapidfire's functions by cumulative time minus what they spent inside the run's
    own TRL/transformers/torch calls is hard to separate in a profile; shown instead: its
    functions by own time and by cumulative time, the first ``top`` of each."""
    stats = pstats.Stats(profile)
    rows = [(key, value) for key, value in stats.stats.items()  # type: ignore[attr-defined]
            if "trl_rapidfire" in key[0]]
    lines = []
    for label, index in (("own", 2), ("cumulative", 3)):
        lines.append(f"    trl_rapidfire by {label} time:")
        for (path, line, name), value in sorted(rows, key=lambda r: -r[1][index])[:top]:
            short = path.split("trl_rapidfire/")[-1]
            lines.append(f"      {1e3 * value[index]:8.1f} ms  {value[1]:6d} calls  "
                         f"{short}:{line} {name}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trainers", nargs="+", default=["sft", "dpo", "grpo"],
                        choices=["sft", "dpo", "grpo"])
    parser.add_argument("--tracking", nargs="+", default=["none", "mlflow"],
                        choices=["none", "mlflow"])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lean", action="store_true",
                        help="cpu_training_kwargs' flags (no checkpoint, no progress bar) "
                        "instead of TRL's defaults")
    parser.add_argument("--profile", action="store_true",
                        help="profile one more RF repetition and print trl_rapidfire's share")
    parser.add_argument("--quick", action="store_true", help="SFT, no tracking, 16 rows, 1 pair")
    parser.add_argument("--fresh", action="store_true",
                        help="each side in a fresh process (its imports timed apart), as a "
                        "script of one config runs; default: both sides in this process")
    parser.add_argument("--child", nargs=4, metavar=("TRAINER", "SIDE", "TRACKING", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.quick:
        args.trainers, args.tracking, args.rows, args.repeats = ["sft"], ["none"], 16, 1
    import torch

    torch.set_num_threads(args.threads)
    print(f"one config, construct + train: trainers {args.trainers}, tracking {args.tracking}, "
          f"{args.rows} rows, {args.threads} thread(s), best of {args.repeats} pairs (A B A B)")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="rf-one-config-") as root:
        stores = Stores(root) if "mlflow" in args.tracking else None
        count = 0

        def side(kind: str, rf: bool, tracking: str,
                 profile: cProfile.Profile | None = None) -> Timing:
            nonlocal count
            count += 1
            out = os.path.join(root, f"out-{count}")
            if args.fresh and profile is None:
                timing = in_fresh_process(kind, rf, tracking, out, args,
                                          stores if tracking == "mlflow" else None)
            else:
                timing = run_side(kind, rf, args.rows, tracking, out,
                                  stores if tracking == "mlflow" else None, profile, args.lean)
            shutil.rmtree(out, ignore_errors=True)
            return timing

        for kind in args.trainers:
            for tracking in args.tracking:
                side(kind, False, tracking)  # warm-up: imports, first calls
                side(kind, True, tracking)
                plain: list[Timing] = []
                rf: list[Timing] = []
                for _ in range(args.repeats):
                    plain.append(side(kind, False, tracking))
                    rf.append(side(kind, True, tracking))
                a = min(plain, key=lambda t: t.total)
                b = min(rf, key=lambda t: t.total)
                ratio = b.total / a.total
                worst = max(worst, ratio)
                imports = (f" (imports apart: plain {a.imports:.2f} s, rf {b.imports:.2f} s)"
                           if args.fresh else "")
                print(f"  {kind:4s} tracking={tracking:6s} plain {a.total:6.3f} s "
                      f"(construct {a.construct:.3f} + train {a.train:.3f})  rf {b.total:6.3f} s "
                      f"(construct {b.construct:.3f} + train {b.train:.3f}; engine outside "
                      f"the turn {b.switching:.3f})  ratio {ratio:.3f}{imports}")
                if args.profile:
                    profile = cProfile.Profile()
                    side(kind, True, tracking, profile)
                    print("\n".join(ours(profile)))
    print(f"worst ratio {worst:.3f} (target <= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
