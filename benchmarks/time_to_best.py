"""Time to the best config when sweeping many: plain TRL one config after another against one
``RFSFTTrainer`` with a policy that stops the losers early, everything on.

Workload: the tiny offline Llama of ``trl_rapidfire.testing`` with LoRA (rank 8, q_proj and
v_proj), ``--rows`` rows of its synthetic SFT data (default 1024: batch 8, 128 steps a config,
one epoch, linear decay), an eval set of 32 rows (eval batch 32), and N configs whose only
difference is the learning rate, log-spaced from 1e-4 to 1e-1. Shapes: every N of
``--configs`` x every chunk count of ``--chunks`` x every ``--policy``, each measured in turn.

RF side (everything on): ``report_to="mlflow"`` to a NEW sqlite store per experiment
(``MLFLOW_TRACKING_URI`` set in the process before the trainer is built), the evaluation
cadence ``--eval-strategy`` (``policy``: each run is evaluated where its policy reads the
metric and at its last chunk; falls back to ``chunk``, every boundary, where this
trl_rapidfire does not have it yet, and says so), and the policy: ``sh`` =
``SuccessiveHalving("eval_loss", "min", eta=2)`` over the grid; ``hyperband`` =
``Hyperband("eval_loss", "min", eta=2)`` over the grid (skipped, with a message, where the
class is missing); ``optuna`` = ``OptunaSearch`` TPE (N runs, 4 at a time, seed 0) over
``Range(1e-4, 1e-1, log=True)`` + ``OptunaPruner(SuccessiveHalvingPruner(min_resource=<a
chunk's steps>, reduction_factor=2))`` (skipped where Optuna is missing). Timed: construct +
``train()`` until it returns.

Baseline: plain TRL ``SFTTrainer`` per config, one after another, tracked to a new sqlite store
of its own (``report_to="mlflow"``), evaluated once at its last step (inside ``train()``, so
the value lands in the config's MLflow run): the least a person needs to pick the best. It is
measured on a SAMPLE of ``--baseline-sample`` configs spread over the learning-rate range,
always including the RF winner's rate (RF runs first in each repetition), and SCALED to N:
sum of the sample's times x N / sample. The sample's final eval losses give the quality check.
Both sides' new stores are copies of an empty store MLflow migrated once per process, made
before their clocks start (the migrations, ~2 s a new file, a real user pays once per store,
not once per sweep).

Printed for each (N, chunks, policy): the baseline (scaled, its per-config parts), RF's wall,
the ratio, the work-counting bound (chunks the baseline trains, N x chunks, over the chunks RF
trained, ``len(rf.schedule)``) and successive halving's theoretical one (``halving_work``), the
fraction of the bound reached (ratio / bound), the first metric (construction start to the
first chunk's end) and the time to RF's best (to its winner's last chunk's end), the quality
gap (RF's best final eval loss against the best sampled baseline's), the exactness check (the
RF winner's final eval loss ``==`` its config trained alone by plain TRL; exit status 1 if not,
timings never change the exit status) and where RF's time went (``time_to_best_parts.py``:
construction, MLflow registration, training steps, evaluations, the rest of the turns,
switching, policy decisions, garbage collection, the final MLflow flush, the tracking
thread). A summary table ends the run; ``--json`` writes every figure.

Repetitions: ``--repeats`` pairs, RF then baseline (B A B A), after an untimed warm-up of both
code paths (imports, MLflow's first use, each policy's first call); each side keeps its best.
``--peers`` also runs transformers' ``hyperparameter_search(backend="optuna")`` with Optuna's
``SuccessiveHalvingPruner`` and Ray Tune's ASHA on the same workload once per (N, chunks)
(``time_to_best_peers.py``; ``pip install -e '.[bench]'``).

The parts sit beside this file, loaded by :func:`sibling` (the benchmarks are no package):
``time_to_best_sweep.py`` (the shapes, their figures, the summary, the JSON),
``time_to_best_sides.py`` (the two sides, the stores, the policies, the sample),
``time_to_best_parts.py`` (the timers) and ``time_to_best_peers.py``.

Usage::

    python benchmarks/time_to_best.py --quick          # 4 configs x 4 chunks, 64 rows (~25 s)
    python benchmarks/time_to_best.py                  # 16 configs x 16 chunks, sh
    python benchmarks/time_to_best.py --configs 16 64 256 --chunks 16 64 \\
        --policy sh hyperband optuna --repeats 2 --json time_to_best.json
    python benchmarks/time_to_best.py --configs 16 --chunks 16 --rows 2048 --report-to none \\
        --eval-strategy chunk --baseline-sample 16    # the old comparison (MLflow off, all 16)
    python benchmarks/time_to_best.py --searches       # search methods at one budget (below)

``--searches`` compares, on the old workload (2048 rows, 64 eval rows) over
``learning_rate=Range(1e-4, 1e-1, log=True)`` x ``lr_scheduler_type=List([...3])``, random
search, successive halving, Optuna's TPE and TPE with Optuna's successive halving pruner at the
same budget of chunks, over ``--seeds`` (0 1 2): see ``benchmarks/search_comparison.py``,
which it loads (it takes the first ``--configs`` and ``--chunks``). It needs Optuna.

Runs offline on CPU (``HF_HUB_OFFLINE=1`` is set); on a CUDA machine it runs unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

DEFAULT_CONFIGS = 16
DEFAULT_CHUNKS = 16
DEFAULT_ROWS = 1024
SWEEP_EVAL_ROWS = 32
QUICK = dict(configs=[4], chunks=[4], rows=64, baseline_sample=2)
# --searches keeps the workload it was measured on (docs/adaptive-search.md).
SEARCH_ROWS = 2048
EVAL_ROWS = 64
LR_MIN, LR_MAX = 1e-4, 1e-1
BATCH_SIZE = 8
EVAL_BATCH_SIZE = 32
LORA_RANK = 8
ETA = 2
OPTUNA_CONCURRENT = 4  # OptunaSearch's default max_concurrent


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Swallow what trainers print (plain TRL prints every log dict when tqdm is disabled)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def learning_rates(n: int, lo: float = LR_MIN, hi: float = LR_MAX) -> list[float]:
    """``n`` rates evenly spaced in log scale from ``lo`` to ``hi``, rounded to 3 digits."""
    if n == 1:
        return [lo]
    return [float(f"{lo * (hi / lo) ** (i / (n - 1)):.3g}") for i in range(n)]


def shared_kwargs(report_to: str = "none") -> dict[str, Any]:
    from trl_rapidfire.testing import cpu_training_kwargs

    kwargs = cpu_training_kwargs()
    kwargs.update(per_device_train_batch_size=BATCH_SIZE,
                  per_device_eval_batch_size=EVAL_BATCH_SIZE, num_train_epochs=1,
                  lr_scheduler_type="linear", report_to=report_to)
    return kwargs


def lora() -> Any:
    from trl_rapidfire.testing import tiny_lora_config

    return tiny_lora_config(r=LORA_RANK, target_modules=("q_proj", "v_proj"))


def halving_work(configs: int, chunks: int, eta: int) -> int:
    """Chunks trained by synchronous successive halving (rungs at eta**k chunks)."""
    work, alive, done, rung = 0, configs, 0, 1
    while rung < chunks:
        work += alive * (rung - done)
        done, alive = rung, max(1, alive // eta)
        rung *= eta
    return work + alive * (chunks - done)


def sibling(name: str) -> ModuleType:
    """``<name>.py`` beside this file (the benchmarks are no package), loaded once."""
    module_name = f"{name}_benchmark"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name,
                                                  Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def search_comparison() -> ModuleType:
    return sibling("search_comparison")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", type=int, nargs="+", default=None,
                   help=f"numbers of configs N, each measured in turn (default {DEFAULT_CONFIGS})")
    p.add_argument("--chunks", type=int, nargs="+", default=None,
                   help=f"chunk counts, each measured in turn (default {DEFAULT_CHUNKS})")
    p.add_argument("--policy", nargs="+", default=["sh"],
                   choices=sibling("time_to_best_sides").POLICIES,
                   help="policies, each measured in turn (default sh)")
    p.add_argument("--rows", type=int, default=None,
                   help=f"training rows (default {DEFAULT_ROWS}; --searches {SEARCH_ROWS})")
    p.add_argument("--eval-strategy", default="policy", choices=["policy", "chunk"],
                   help="RF's evaluation cadence (policy falls back to chunk where missing)")
    p.add_argument("--report-to", default="mlflow", choices=["mlflow", "none"],
                   help="both sides' (and the peers') tracking (default mlflow)")
    p.add_argument("--baseline-sample", type=int, default=8,
                   help="configs the baseline trains (spread over the rates, with the RF "
                        "winner's); its time is scaled to N")
    p.add_argument("--eta", type=int, default=ETA)
    p.add_argument("--repeats", type=int, default=1,
                   help="alternate the sides this many times; each keeps its fastest")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--peers", action="store_true",
                   help="also run transformers' hyperparameter_search (optuna) and Ray Tune "
                        "ASHA on the same workload, once per (N, chunks)")
    p.add_argument("--peer-timeout", type=float, default=1800.0,
                   help="seconds after which a peer's search proposes no more trials")
    p.add_argument("--quick", action="store_true",
                   help="4 configs, 4 chunks, 64 rows, sample 2 (with --searches: 4 configs, "
                        "4 chunks, 256 rows, seed 0)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--searches", action="store_true",
                   help="compare random search, successive halving, TPE and TPE + pruner at "
                        "successive halving's budget of chunks (the first --configs of them)")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="--searches: the search seeds to average over (default 0 1 2)")
    args = p.parse_args(argv)
    if args.searches:
        if args.quick:
            args.configs, args.chunks, args.rows = [4], [4], 256
        args.configs = (args.configs or [DEFAULT_CONFIGS])[0]
        args.chunks = (args.chunks or [DEFAULT_CHUNKS])[0]
        args.rows = args.rows or SEARCH_ROWS
        args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
        return args
    if args.repeats < 1 or args.baseline_sample < 1 or args.threads < 1:
        p.error("--repeats, --baseline-sample and --threads must be at least 1")
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    args.configs = args.configs or [DEFAULT_CONFIGS]
    args.chunks = args.chunks or [DEFAULT_CHUNKS]
    args.rows = args.rows or DEFAULT_ROWS
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if args.searches:
        return search_comparison().main(args, sys.modules[__name__])
    return sibling("time_to_best_sweep").run(args, sys.modules[__name__])


def header(args: argparse.Namespace, eval_strategy: str, note: str) -> str:
    steps = math.ceil(args.rows / BATCH_SIZE)
    asked = f"asked {args.eval_strategy!r}" + (f"; {note}" if note else "")
    return (f"time to best: configs {args.configs} x chunks {args.chunks} x policies "
            f"{args.policy}; lr {LR_MIN:g} .. {LR_MAX:g} (log); {args.rows} rows = {steps} "
            f"steps a config (batch {BATCH_SIZE}), eval {SWEEP_EVAL_ROWS} rows; "
            f"eval_strategy={eval_strategy!r} ({asked}); "
            f"report_to={args.report_to!r}; baseline sample {args.baseline_sample}; "
            f"{args.repeats} repetition(s); torch {torch.__version__}, {args.threads} "
            f"thread(s), {platform.machine()}, load {os.getloadavg()[0]:.1f}")


def plain(value: Any) -> Any:
    """NaN and infinities as ``null``, dataclasses as dicts: the JSON stays standard."""
    if hasattr(value, "__dataclass_fields__"):
        value = asdict(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def write_json(path: str, figures: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(plain(figures), fh, indent=2)


def scratch() -> str:
    return tempfile.mkdtemp(prefix="rf-time-to-best-")


if __name__ == "__main__":
    sys.exit(main())
