"""What each part of a turn costs: the engine's switching steps timed call by call.

One ``RFSFTTrainer`` over 8 LoRA configs (4 learning rates x 2 ranks) trains in this process
while the methods that make up a turn are wrapped with a timer (a profiler's view: nothing
else changes). Printed per part: calls, mean and median ms per call, and ms per turn (the
part's total over the number of turns); then the engine's own switching share and, from
``schedule.csv``, the gaps between one chunk's end and the next one's start.

Workloads:

* default: the tiny offline model of ``overhead.py`` (256 rows, batch 8, 1 epoch,
  ``num_chunks=4``, rank 4/8 on q_proj, v_proj);
* ``--fine-chunks``: issue 56's workload for short turns: the tiny model, 8 configs (learning
  rates) x 32 steps in 32 one-step chunks, ``checkpoint_every`` as shipped (``scaling.py``'s
  ``--chunks-sweep`` at ``num_chunks=32``); ``--chunks`` sets another count;
* ``--real-shape``: the Llama at SmolLM2-135M's shape of ``real_shape.py`` (rank 8/16 on
  q, k, v, o; seq 256, batch 1), ``--steps`` steps per config in as many chunks (default 2:
  every run's first and last turn, ~2 min on one core).

Usage::

    python benchmarks/turn_costs.py --quick       # smoke test: 64 rows (~20 s)
    python benchmarks/turn_costs.py --threads 1
    python benchmarks/turn_costs.py --real-shape --threads 1
    python benchmarks/turn_costs.py --fine-chunks --threads 1   # 256 one-step turns
    python benchmarks/turn_costs.py --fine-chunks --count-calls # calls a turn makes

Before/after a change: run this script against the other tree's package, e.g.
``PYTHONPATH=/tmp/before python benchmarks/turn_costs.py --fine-chunks --threads 1``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TIMES: dict[str, list[float]] = {}  # label -> each call's seconds, in the order instrumented


def timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper that adds each call's duration to TIMES[label]."""
    original = getattr(owner, name)
    TIMES[label] = []

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMES[label].append(time.perf_counter() - began)

    setattr(owner, name, wrapper)


def instrument() -> None:
    from trl_rapidfire.engine import callback
    from trl_rapidfire.engine.coordination import Coordinator
    from trl_rapidfire.engine.turns import Turns
    from trl_rapidfire.runtime.models import ModelGroup
    from trl_rapidfire.runtime.residency import Residency
    from trl_rapidfire.runtime.switch import RngState

    for owner, name, label in [
        (Coordinator, "claim", "claim (shared state: lock, journal, decision)"),
        (Turns, "switch_in", "switch in (all of it)"),
        (Residency, "park", "  park a run (into the state cache)"),
        (Residency, "unpark", "  unpark a run"),
        (ModelGroup, "activate", "  activate the run's adapter"),
        (RngState, "restore", "  restore random streams"),
        (Turns, "switch_out", "switch out (random streams, accelerate state)"),
        (Turns, "save_boundary", "boundary checkpoint, in the run's turn"),
        (Coordinator, "defer_finish", "hand the chunk's record to the writer"),
        (callback, "check_finite", "divergence check, in the run's turn"),
    ]:
        timed(owner, name, label)


def workload(args: argparse.Namespace) -> tuple[str, Any, dict[str, Any], tuple, tuple, int]:
    from trl_rapidfire.testing import cpu_training_kwargs

    if args.fine_chunks:
        sys.path.insert(0, str(Path(__file__).parent))
        import scaling

        work = scaling.tiny_workload(32)
        return (work.model_path, work.dataset, work.kwargs, work.targets, (work.rank,),
                args.chunks)
    if not args.real_shape:
        from trl_rapidfire.testing import make_sft_dataset, tiny_model_path

        kwargs = dict(cpu_training_kwargs(), per_device_train_batch_size=8, num_train_epochs=1)
        return (tiny_model_path(), make_sft_dataset(64 if args.quick else 256), kwargs,
                ("q_proj", "v_proj"), (4, 8), 4)
    sys.path.insert(0, str(Path(__file__).parent))
    import real_shape

    shape = real_shape.FULL
    kwargs = real_shape.training_kwargs(argparse.Namespace(batch=1, device="cpu"), shape)
    return (real_shape.model_path(shape), real_shape.dataset(shape, args.steps), kwargs,
            real_shape.TARGET_MODULES, real_shape.LORA_RANKS, args.steps)


def count_calls(train_once: Any, chunks: int, few: int = 2) -> int:
    """What a turn does besides its step, as a count that no load on the machine moves: the
    Python and C function calls made inside ``train()`` (a profile hook counts them), at
    ``chunks`` chunks and at ``few``, the difference over the difference in turns. The same
    steps are trained either way, so the steps' calls cancel out."""
    counted: dict[int, tuple[int, int]] = {}
    train_once(few)  # warm: first-time imports and caches are not a turn's
    calls = [0]

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    for num_chunks in (few, chunks):
        calls[0] = 0
        stats, _ = train_once(num_chunks, hook)
        counted[num_chunks] = (calls[0], stats.turns)
    (calls_few, turns_few), (calls_many, turns_many) = counted[few], counted[chunks]
    print(f"function calls in train(): {calls_few:,} at {few} chunks ({turns_few} turns), "
          f"{calls_many:,} at {chunks} chunks ({turns_many} turns)")
    print(f"calls a turn besides its step: "
          f"{(calls_many - calls_few) / max(turns_many - turns_few, 1):.0f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--real-shape", action="store_true",
                        help="the 135M-shape Llama of real_shape.py instead of the tiny model")
    parser.add_argument("--steps", type=int, default=2,
                        help="with --real-shape: steps (and chunks) per config (default 2)")
    parser.add_argument("--fine-chunks", action="store_true",
                        help="8 configs x 32 steps in --chunks one-step chunks, checkpoints as "
                             "shipped (issue 56's short-turn workload)")
    parser.add_argument("--chunks", type=int, default=32,
                        help="with --fine-chunks: num_chunks (default 32: one step a chunk)")
    parser.add_argument("--count-calls", action="store_true",
                        help="instead of timing: the function calls a turn makes besides its "
                             "step (train() at 2 chunks and at the workload's, counted by a "
                             "profile hook): a figure the machine's load does not move")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="smoke test: the tiny model, 64 rows")
    parser.add_argument("--checkpoint-every", default=None,
                        help="checkpoint_every (default: every boundary, the most a turn costs; "
                             "with --fine-chunks, the config's default)")
    args = parser.parse_args(argv)
    if args.quick and args.real_shape:
        parser.error("--quick is the tiny model's smoke test: leave out --real-shape")
    if args.fine_chunks and (args.quick or args.real_shape):
        parser.error("--fine-chunks is a workload of its own: leave out --quick/--real-shape")
    if args.checkpoint_every is None and not args.fine_chunks:
        args.checkpoint_every = "chunk"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets
    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.storage.schedule import Handoffs
    from trl_rapidfire.testing import tiny_lora_config

    path, data, kwargs, targets, ranks, chunks = workload(args)
    if args.fine_chunks:  # scaling.py's 8 learning rates, one rank
        import scaling

        rates = scaling.learning_rates(8)
    else:  # 4 learning rates x 2 ranks
        rates = [1e-4, 3e-4, 1e-3, 3e-3]
    if args.checkpoint_every is not None:
        kwargs = dict(kwargs, checkpoint_every=args.checkpoint_every)

    def train_once(num_chunks: int, hook: Any = None) -> tuple[Any, list[Any]]:
        with tempfile.TemporaryDirectory(prefix="rf-turn-costs-") as out:
            trainer = RFSFTTrainer(
                model=path,
                args=RFSFTConfig(output_dir=out, num_chunks=num_chunks,
                                 learning_rate=List(rates), **kwargs),
                train_dataset=data,
                peft_config=List([tiny_lora_config(r=r, target_modules=targets)
                                  for r in ranks]))
            with contextlib.redirect_stdout(io.StringIO()):
                sys.setprofile(hook)
                try:
                    trainer.train()
                finally:
                    sys.setprofile(None)
            return trainer.engine.stats, list(trainer.schedule)

    if args.count_calls:
        return count_calls(train_once, chunks)
    instrument()
    stats, schedule = train_once(chunks)
    turns = max(stats.turns, 1)
    print(f"trl-rapidfire turn costs ({'real shape' if args.real_shape else 'tiny model'}, "
          f"8 runs, {turns} turns, torch threads {torch.get_num_threads()})")
    print(f"{'part':50s} {'calls':>6s} {'mean ms':>8s} {'median':>8s} {'ms/turn':>8s}")
    for label, times in TIMES.items():
        if not times:
            continue
        print(f"{label:50s} {len(times):6d} {1000 * statistics.mean(times):8.2f} "
              f"{1000 * statistics.median(times):8.2f} {1000 * sum(times) / turns:8.2f}")
    hand = Handoffs.of(sorted(schedule, key=lambda c: c.start_time))
    print(f"engine: switching {1000 * stats.switching / turns:.2f} ms per turn, "
          f"{100 * stats.switching / stats.compute:.2f}% of compute; schedule.csv gaps "
          f"{1000 * hand.mean_gap:.2f} ms per turn, {100 * hand.share:.2f}% of chunk time; "
          f"boundary checkpoints on the writer thread "
          f"{1000 * stats.checkpoint_writing / max(stats.checkpoints, 1):.1f} ms each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
