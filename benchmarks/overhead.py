"""Overhead benchmark: one ``RFSFTTrainer`` over 8 LoRA configs vs. 8 plain ``SFTTrainer``s.

Workload (pinned): the tiny offline Llama of ``trl_rapidfire.testing``, a synthetic SFT dataset
of 256 rows, per-device batch 8, 1 epoch (32 steps per config), and 8 LoRA configs: learning
rate 1e-4, 3e-4, 1e-3, 3e-3 x LoRA rank 4, 8 (target modules q_proj, v_proj).

Side A (rapidfire): ONE ``RFSFTTrainer`` with ``learning_rate=List([...])``,
``peft_config=List([...])`` and ``num_chunks=4``; it trains all 8 runs in one process, chunk by
chunk. Timed: construction (model load, dataset preparation, one trainer per run) plus
``train()`` (which also writes each run's final adapter), i.e. everything a user waits for.

Side B (baseline): the same 8 configs trained back to back, each by its own plain
``SFTTrainer(model=<path>, args=SFTConfig(...), peft_config=<LoRA>)``. Timed: constructing and
training all 8, plus ``save_model()`` of each (side A writes every final adapter inside
``train()``, so B saves too; the ``save_s`` column shows its share, ~20 ms a run on CPU).

Both sides run in ONE process, alternating A B A B ... (``--repeats`` pairs, after an untimed
warm-up of both code paths); each side's best (minimum) time is kept, which filters out noise
from other processes on the machine. The torch thread count is fixed before anything runs.

How to read the output:

* (a) ``ratio = best A / best B``: below 1 means the rapidfire experiment finishes sooner than
  the sequential baseline (it loads the model and prepares the dataset once, not 8 times).
  Target: <= 0.95.
* (b) ``switching / compute`` of side A: ``rf.engine.stats.switching`` is the time of the
  engine loop spent outside the runs' turns (parking and unparking adapter and optimizer
  state, restoring RNG and accelerate state, the hand-off between runs, scheduling,
  bookkeeping);
  ``compute`` is the time spent inside them (training steps, logging, saving). Reported for the
  best A repetition, with the median over all A repetitions beside it. Target: <= 2%.
* The table lists every repetition: total = construct + train (+ save for B); for A,
  ``engine`` is the engine loop's wall time (the rest of ``train()`` picks and activates the
  best run), split into ``compute`` and ``switch``.
* ``weights``: after the first A and the first B repetition, each RF run's final adapter
  (``<output_dir>/runs/run-<i>/final/adapter_model.safetensors``) is compared tensor for tensor
  (``torch.equal``) with the adapter the plain trainer of the same config saved. Bitwise
  equality is expected on CPU at a fixed thread count (both sides use the same one here). The
  script exits with status 1 if any run differs; timings never change the exit status.

Usage::

    python benchmarks/overhead.py                 # 3 pairs, 256 rows, default thread count
    python benchmarks/overhead.py --quick         # 64 rows, 1 pair: a smoke test
    python benchmarks/overhead.py --threads 1 --repeats 5 --json overhead.json
    python benchmarks/overhead.py --threads 1 --busy 1   # another process keeps a core busy

Runs offline on CPU (``HF_HUB_OFFLINE=1`` is fine); on a CUDA machine it runs unchanged.

On a CPU shared with other busy processes (the printed load average exceeds the core count),
torch's OpenMP workers spin-wait for cores they do not get and single repetitions can take
several times longer than the others; the minimum filters out most of it, but compare with
``--threads 1`` (or ``OMP_WAIT_POLICY=passive`` in the environment) before reading much into a
ratio measured there.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3)
LORA_RANKS = (4, 8)
TARGET_MODULES = ("q_proj", "v_proj")
BATCH_SIZE = 8
EPOCHS = 1
NUM_CHUNKS = 4
DEFAULT_ROWS = 256
QUICK_ROWS = 64
DEFAULT_REPEATS = 3

TARGET_RATIO = 0.95  # (a) best A / best B
TARGET_SWITCHING = 0.02  # (b) switching / compute

ADAPTER_FILE = "adapter_model.safetensors"

# Grid order of the runs: config fields first (learning_rate), then trainer-level knobs
# (peft_config), the last axis varying fastest: run-0 = (1e-4, r4), run-1 = (1e-4, r8), ...
Config = tuple[float, int]  # (learning rate, LoRA rank)
GRID: tuple[Config, ...] = tuple((lr, r) for lr in LEARNING_RATES for r in LORA_RANKS)


@dataclass
class Sample:
    """One timed repetition of one side (seconds)."""

    side: str  # "A" (rapidfire) or "B" (baseline)
    rep: int
    total: float
    construct: float
    train: float
    save: float = 0.0  # B: save_model() of the 8 trainers (A saves inside train())
    engine: float | None = None  # A: rf.engine.stats.wall
    compute: float | None = None  # A: rf.engine.stats.compute
    switching: float | None = None  # A: rf.engine.stats.switching
    turns: int | None = None  # A: chunks trained
    handoff_share: float | None = None  # A: gaps between chunks / chunk time (schedule.csv)
    handoff_ms: float | None = None  # A: mean gap between one chunk's end and the next start

    @property
    def switching_ratio(self) -> float | None:
        if self.switching is None or not self.compute:
            return None
        return self.switching / self.compute


@dataclass
class Workload:
    model_path: str
    dataset: Any
    rows: int

    @property
    def steps_per_config(self) -> int:
        return math.ceil(self.rows / BATCH_SIZE) * EPOCHS


def training_kwargs() -> dict[str, Any]:
    """The config values both sides share (everything but the knobs and output_dir)."""
    from trl_rapidfire.testing import cpu_training_kwargs

    kwargs = cpu_training_kwargs()
    kwargs.update(per_device_train_batch_size=BATCH_SIZE, num_train_epochs=EPOCHS)
    kwargs["report_to"] = "none"
    return kwargs


def lora(rank: int) -> Any:
    from trl_rapidfire.testing import tiny_lora_config

    return tiny_lora_config(r=rank, target_modules=TARGET_MODULES)


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Swallow what trainers print (plain TRL prints every log dict when tqdm is disabled)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


# ---------------------------------------------------------------------------- the two sides


def run_rapidfire(
    work: Workload,
    output_dir: str,
    rep: int,
    learning_rates: Sequence[float] = LEARNING_RATES,
    ranks: Sequence[int] = LORA_RANKS,
    tracking: bool = True,
) -> tuple[Sample, dict[str, Config]]:
    """Side A: one RFSFTTrainer over the grid. Returns the timing and each run's config.

    With ``tracking`` (the default: every feature that exists is on), runs are logged to
    MLflow (the sqlite store ``MLFLOW_TRACKING_URI`` points to) and their control tags are
    polled, as a user's experiment would be.
    """
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.shared_state.runs import RunStatus
    from trl_rapidfire.storage.schedule import Handoffs

    with quiet_stdout():
        t0 = time.perf_counter()
        trainer = RFSFTTrainer(
            model=work.model_path,
            args=RFSFTConfig(
                output_dir=output_dir,
                num_chunks=NUM_CHUNKS,
                learning_rate=List(list(learning_rates)),
                **{**training_kwargs(), "report_to": "mlflow" if tracking else "none"},
            ),
            train_dataset=work.dataset,
            peft_config=List([lora(r) for r in ranks]),
        )
        t1 = time.perf_counter()
        trainer.train()
        t2 = time.perf_counter()

    configs: dict[str, Config] = {}
    for result in trainer.runs:
        if result.status != RunStatus.COMPLETED:
            raise RuntimeError(f"RF {result.name} ended {result.status}: {result.error}")
        configs[result.name] = (result.knobs["learning_rate"], result.knobs["peft_config"].r)
    stats = trainer.engine.stats
    hand = Handoffs.of(trainer.schedule)
    sample = Sample(
        side="A", rep=rep, total=t2 - t0, construct=t1 - t0, train=t2 - t1,
        engine=stats.wall, compute=stats.compute, switching=stats.switching, turns=stats.turns,
        handoff_share=hand.share, handoff_ms=1000 * hand.mean_gap,
    )  # fmt: skip
    return sample, configs


def run_baseline(
    work: Workload, output_dir: str, rep: int, grid: Sequence[Config] = GRID
) -> tuple[Sample, dict[Config, str]]:
    """Side B: one plain SFTTrainer per config, back to back, each saving its adapter."""
    from trl import SFTConfig, SFTTrainer

    construct = train = save = 0.0
    adapters: dict[Config, str] = {}
    with quiet_stdout():
        for i, (lr, rank) in enumerate(grid):
            run_dir = os.path.join(output_dir, f"run-{i}")
            t0 = time.perf_counter()
            trainer = SFTTrainer(
                model=work.model_path,
                args=SFTConfig(output_dir=run_dir, learning_rate=lr, **training_kwargs()),
                train_dataset=work.dataset,
                peft_config=lora(rank),
            )
            t1 = time.perf_counter()
            trainer.train()
            t2 = time.perf_counter()
            trainer.save_model(os.path.join(run_dir, "final"))
            t3 = time.perf_counter()
            construct, train, save = construct + t1 - t0, train + t2 - t1, save + t3 - t2
            adapters[(lr, rank)] = os.path.join(run_dir, "final", ADAPTER_FILE)
            del trainer
    sample = Sample(
        side="B", rep=rep, total=construct + train + save, construct=construct, train=train,
        save=save,
    )  # fmt: skip
    return sample, adapters


def warm_up(work: Workload, tracking: bool) -> float:
    """Run both code paths once on a few rows (untimed): lazy imports, first-call costs."""
    from trl_rapidfire.testing import make_sft_dataset

    rows = NUM_CHUNKS * BATCH_SIZE  # one step per chunk: the smallest full plan
    small = Workload(work.model_path, make_sft_dataset(rows), rows)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rf-overhead-warmup-") as tmp:
        run_rapidfire(small, os.path.join(tmp, "a"), 0, LEARNING_RATES[:2], LORA_RANKS[:1],
                      tracking=tracking)
        run_baseline(small, os.path.join(tmp, "b"), 0, GRID[:1])
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------- correctness


def compare_adapters(
    rf_dir: str, rf_configs: dict[str, Config], plain: dict[Config, str]
) -> list[str]:
    """Compare RF run ``run-<i>`` with the plain trainer of grid entry ``i``, tensor for tensor.

    Returns one line per run that differs (empty: every run is bitwise equal), including runs
    whose knobs are not the grid entry their name says (the run order is part of the contract).
    """
    from safetensors.torch import load_file

    differ = []
    for i, config in enumerate(GRID):
        name = f"run-{i}"
        label = f"{name} (lr={config[0]:g}, r={config[1]})"
        if rf_configs.get(name) != config:
            differ.append(f"{label}: the RF run of that name has knobs {rf_configs.get(name)}")
            continue
        path = os.path.join(rf_dir, "runs", name, "final", ADAPTER_FILE)
        if not os.path.exists(path):
            differ.append(f"{label}: no {path}")
            continue
        a, b = load_file(path), load_file(plain[config])
        if a.keys() != b.keys():
            differ.append(f"{label}: tensor names differ")
            continue
        bad = [key for key in a if not torch.equal(a[key], b[key])]
        if any(a[k].shape != b[k].shape for k in bad):
            differ.append(f"{label}: tensor shapes differ")
        elif bad:
            worst = max((a[k].double() - b[k].double()).abs().max().item() for k in bad)
            differ.append(f"{label}: {len(bad)}/{len(a)} tensors differ (max |diff| {worst:.3g})")
    return differ


# ---------------------------------------------------------------------------- reporting


def _fmt(value: float | None, spec: str = "8.2f") -> str:
    return format(value, spec) if value is not None else " " * len(format(0.0, spec))


def print_table(samples: list[Sample]) -> None:
    header = (
        f"{'rep':>3} {'side':<13} {'total_s':>8} {'construct_s':>11} {'train_s':>8} "
        f"{'save_s':>7} {'engine_s':>8} {'compute_s':>9} {'switch_s':>8} {'switch%':>7}"
    )
    print(header)
    print("-" * len(header))
    for s in samples:
        ratio = s.switching_ratio
        side = "A rapidfire" if s.side == "A" else "B baseline"
        print(
            f"{s.rep:>3} {side:<13} {s.total:8.2f} {s.construct:11.2f} {s.train:8.2f} "
            f"{_fmt(s.save if s.side == 'B' else None, '7.3f')} {_fmt(s.engine)} "
            f"{_fmt(s.compute, '9.2f')} {_fmt(s.switching, '8.3f')} "
            f"{_fmt(100 * ratio if ratio is not None else None, '6.2f')}"
            + ("%" if ratio is not None else "")
        )


@dataclass
class Summary:
    """The two headline figures: (a) from the best of each side, (b) from the best A."""

    best_a: Sample
    best_b: Sample
    switching_median: float  # median switching / compute over all A repetitions
    a_repeats: int

    @property
    def ratio(self) -> float:
        return self.best_a.total / self.best_b.total

    @property
    def switching(self) -> float:
        return self.best_a.switching_ratio or 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "best_a_s": self.best_a.total,
            "best_a_rep": self.best_a.rep,
            "best_b_s": self.best_b.total,
            "best_b_rep": self.best_b.rep,
            "ratio": self.ratio,
            "ratio_target": TARGET_RATIO,
            "ratio_met": self.ratio <= TARGET_RATIO,
            "switching_over_compute": self.switching,
            "switching_over_compute_source": f"best A repetition (rep {self.best_a.rep})",
            "switching_over_compute_median": self.switching_median,
            "a_repeats": self.a_repeats,
            "switching_target": TARGET_SWITCHING,
            "switching_met": self.switching <= TARGET_SWITCHING,
        }


def summarize(samples: list[Sample]) -> Summary:
    a_samples = [s for s in samples if s.side == "A"]
    b_samples = [s for s in samples if s.side == "B"]
    return Summary(
        best_a=min(a_samples, key=lambda s: s.total),
        best_b=min(b_samples, key=lambda s: s.total),
        switching_median=statistics.median(s.switching_ratio or 0.0 for s in a_samples),
        a_repeats=len(a_samples),
    )


def print_summary(summary: Summary, differ: list[str]) -> None:
    equal = len(GRID) - len(differ)
    if differ:
        print(f"weights: {equal}/{len(GRID)} runs bitwise equal; differing:")
        for line in differ:
            print(f"  {line}")
    else:
        print(f"weights: bitwise equal for {equal}/{len(GRID)} runs (RF rep 1 vs baseline rep 1)")
    print()
    a, b = summary.best_a, summary.best_b
    print(
        f"(a) ratio = best A / best B = {a.total:.2f} s / {b.total:.2f} s = "
        f"{summary.ratio:.3f}   target <= {TARGET_RATIO}   "
        f"[{verdict(summary.ratio <= TARGET_RATIO)}]"
    )
    print(
        f"    construct {a.construct:.2f} s vs {b.construct:.2f} s; "
        f"train {a.train:.2f} s vs {b.train + b.save:.2f} s (B: train + save)"
    )
    print(
        f"(b) switching / compute (best A, rep {a.rep}) = {a.switching:.3f} s / "
        f"{a.compute:.2f} s = {100 * summary.switching:.2f}%   "
        f"target <= {100 * TARGET_SWITCHING:g}%   "
        f"[{verdict(summary.switching <= TARGET_SWITCHING)}]"
    )
    print(
        f"    median over {summary.a_repeats} A repetition(s): "
        f"{100 * summary.switching_median:.2f}%"
    )
    print(
        f"    as a user sees it in schedule.csv (best A): gaps between chunks = "
        f"{100 * a.handoff_share:.2f}% of chunk time, {a.handoff_ms:.1f} ms per turn"
    )


def load_average() -> float | None:
    """The 1-minute load average (other processes competing for the cores), if known."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="RFSFTTrainer over 8 LoRA configs vs. 8 plain SFTTrainers, back to back.",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"A/B pairs to run (default {DEFAULT_REPEATS}; 1 with --quick)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: torch's count at start)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help=f"dataset rows (default {DEFAULT_ROWS}; {QUICK_ROWS} with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke test: {QUICK_ROWS} rows, 1 pair"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    parser.add_argument(
        "--busy", type=int, default=0, metavar="N",
        help="keep N other processes spinning on the CPU while both sides run (a busy "
             "machine's neighbour; default 0)",
    )
    parser.add_argument(
        "--no-tracking", dest="tracking", action="store_false",
        help="side A without MLflow tracking and op polling (default: on, as for users)",
    )
    args = parser.parse_args(argv)
    if args.rows is None:
        args.rows = QUICK_ROWS if args.quick else DEFAULT_ROWS
    if args.repeats is None:
        args.repeats = 1 if args.quick else DEFAULT_REPEATS
    if args.repeats < 1 or args.rows < 1:
        parser.error("--repeats and --rows must be at least 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.busy < 0:
        parser.error("--busy must be at least 0")
    return args


@contextlib.contextmanager
def busy_neighbours(n: int) -> Iterator[None]:
    """``n`` processes that each keep one core busy (pure Python spinning) for the body."""
    import subprocess

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with busy_neighbours(args.busy):
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    threads_at_start = torch.get_num_threads()
    threads = args.threads or threads_at_start
    torch.set_num_threads(threads)

    import datasets
    import peft
    import transformers
    import trl

    from trl_rapidfire.testing import make_sft_dataset, tiny_model_path

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    work = Workload(tiny_model_path(), make_sft_dataset(args.rows), args.rows)
    lrs = ", ".join(f"{lr:g}" for lr in LEARNING_RATES)
    ranks = ", ".join(str(r) for r in LORA_RANKS)
    print("trl-rapidfire overhead benchmark")
    print(
        f"  workload : {len(GRID)} LoRA configs = lr [{lrs}] x rank [{ranks}] "
        f"({', '.join(TARGET_MODULES)}); {args.rows} rows, batch {BATCH_SIZE}, {EPOCHS} epoch "
        f"= {work.steps_per_config} steps/config; num_chunks={NUM_CHUNKS}"
    )
    print(
        f"  threads  : torch.set_num_threads({threads}) (torch's count at start: "
        f"{threads_at_start})"
    )
    print(
        f"  device   : {device}; python {platform.python_version()}, torch {torch.__version__}, "
        f"trl {trl.__version__}, transformers {transformers.__version__}, "
        f"peft {peft.__version__}"
    )
    print(f"  repeats  : {args.repeats} A/B pair(s), alternating; best (min) time per side")
    load_start = load_average()
    print(
        f"  load avg : {load_start} at start ({os.cpu_count()} CPUs; {args.busy} busy "
        "neighbour process(es), --busy); "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '<unset>')}"
    )
    if args.tracking:
        # One store for the whole benchmark, created during the warm-up (a new sqlite store
        # costs ~2 s once); each repetition is its own experiment in it.
        store = tempfile.mkdtemp(prefix="rf-overhead-mlflow-")
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
        print(f"  tracking : side A logs to MLflow ({os.environ['MLFLOW_TRACKING_URI']}) and "
              "polls control tags every second; --no-tracking turns both off")
    else:
        print("  tracking : off (--no-tracking)")
    print(f"  warm-up  : {warm_up(work, args.tracking):.2f} s (untimed)", flush=True)
    print()

    samples: list[Sample] = []
    differ: list[str] = []
    for rep in range(1, args.repeats + 1):
        dirs = {side: tempfile.mkdtemp(prefix=f"rf-overhead-{side}{rep}-") for side in "AB"}
        try:
            gc.collect()
            a, rf_configs = run_rapidfire(work, dirs["A"], rep, tracking=args.tracking)
            samples.append(a)
            print(f"  rep {rep}: A rapidfire {a.total:7.2f} s", flush=True)
            gc.collect()
            b, plain_adapters = run_baseline(work, dirs["B"], rep)
            samples.append(b)
            print(f"  rep {rep}: B baseline  {b.total:7.2f} s", flush=True)
            if rep == 1:
                differ = compare_adapters(dirs["A"], rf_configs, plain_adapters)
        finally:
            for d in dirs.values():
                shutil.rmtree(d, ignore_errors=True)
    print()

    summary = summarize(samples)
    print_table(samples)
    load_end = load_average()
    print(f"(load average at the end: {load_end})")
    print()
    print_summary(summary, differ)

    if args.json:
        report = {
            "workload": {
                "configs": [{"learning_rate": lr, "lora_r": r} for lr, r in GRID],
                "target_modules": list(TARGET_MODULES),
                "rows": args.rows,
                "per_device_train_batch_size": BATCH_SIZE,
                "num_train_epochs": EPOCHS,
                "steps_per_config": work.steps_per_config,
                "num_chunks": NUM_CHUNKS,
            },
            "threads": threads,
            "threads_at_start": threads_at_start,
            "device": device,
            "cpu_count": os.cpu_count(),
            "load_average": {"start": load_start, "end": load_end},
            "busy_neighbours": args.busy,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "versions": {
                "python": platform.python_version(), "torch": torch.__version__,
                "trl": trl.__version__, "transformers": transformers.__version__,
                "peft": peft.__version__,
            },
            "repeats": args.repeats,
            "samples": [asdict(s) | {"switching_ratio": s.switching_ratio} for s in samples],
            **summary.to_json(),
            "weights_equal_runs": len(GRID) - len(differ),
            "weights_total_runs": len(GRID),
            "weights_differing": differ,
        }  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.json}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
