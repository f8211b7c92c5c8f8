"""Scaling benchmark: how the cost of one RF experiment grows with its number of configs N.

For each N (increasing; each N in a fresh process of its own after an untimed warm-up, or all
in this one with ``--one-process``), one ``RFSFTTrainer``
trains N LoRA configs that differ only in their learning rate
(``learning_rate=List([1e-4 * (1 + i / N) for i in range(N)])``, one ``peft_config``,
``num_chunks=--chunks``), and K of them (``--sample``, spread over the N learning rates) are
trained each by its own plain ``SFTTrainer`` (construct + train + ``save_model``) as the
sequential baseline. What should stay flat as N grows is the cost per step, per turn and per
run's construction; what should shrink is RF's wall time against the sequential one.

Workloads:

* default: the tiny offline Llama of ``trl_rapidfire.testing`` (batch 8, 1 epoch,
  ``--steps`` steps per config = steps x 8 rows; rank 8 on q_proj, v_proj), N = 8, 32, 128,
  512, 8 steps per config in 4 chunks;
* ``--real-shape``: the Llama at SmolLM2-135M's shape of ``real_shape.py`` (random weights;
  batch 1, ``--steps`` rows of 256 tokens; rank 16 on q, k, v, o_proj), N = 8, 32, 4 steps per
  config in 2 chunks (built under the temp dir on first use: a few minutes once);
* ``--chunks-sweep``: the tiny model, 8 configs x 32 steps with ``num_chunks`` 2, 8 and 32 (16
  steps a chunk down to 1): what short turns cost.

How to read the table (a row per N):

* ``constr ms/run``: the trainer's construction (model load, dataset preparation, one trainer
  per run) over N.
* ``step mean/med``: one optimizer step, ``on_step_begin`` to ``on_step_end`` of a callback
  every run gets (``callbacks=[StepClock()]``), each run's first step left out (it is
  ``first``, with its one-time work). The engine suspends a run inside ``on_step_begin`` after
  the user callbacks ran, so a step that began a turn would also hold the other runs' turns:
  ``Turns.end_turn`` is wrapped with a counter and a step during which it moved is left out
  (every chunk's first step but the run's first chunk's); the wrapper also restarts such a
  step's clock when the run resumes, and that remainder is printed apart (``resumed``).
* ``chunk ms`` / ``gap ms``: from ``trainer.schedule`` (``schedule.csv``): a chunk's duration
  and the gap between one chunk's end and the next one's start (the switch between turns).
* ``sw/comp``: ``engine.stats`` switching / compute. The engine books a boundary
  checkpoint's time in the run's turn (serializing it) as switching, not compute, so this is
  every fixed cost of a turn against the training itself.
* ``wall RF/seq*``: RF's construct + train over the baseline's mean per config x N: the
  sequential side is EXTRAPOLATED from the K sampled configs, never trained in full.
* ``1st RF/seq``: the time until every config has its first metric (RF: the last end of a
  run's chunk 0 in the schedule, from just before construction) over the sequential one,
  (N - 1) x T + T / c (T: the baseline's mean per config, c: chunks). ``bound`` = N / (c (N -
  1) + 1), what RF reaches if it costs nothing besides the same steps; ``/bound`` their ratio.
Why a process per N (and per ``num_chunks`` of the sweep): the same N=512 experiment is ~20%
slower per step in a process that trained N = 8, 32 and 128 before it than in a fresh one (6.9
vs 9.5 ms mean here), a cost of the process's age, not of N; the ratios against plain TRL are
still taken inside one process, each N's own. Between fresh processes the same figure still
moves by 10-15% on this shared 2-core machine: ``--repeat R`` runs every N (or chunk count) R
times, interleaved, and prints the median of each figure.

* ``RSS MiB``: ``ru_maxrss``, the PROCESS's peak so far (with ``--one-process``, N grows, so
  it is about this N's).
  ``disk MiB``: the peak size of output_dir during ``train()`` (polled every 0.2 s).
* ``bitwise``: each sampled config's RF final adapter against the plain trainer's, tensor for
  tensor (``torch.equal``). Exit status 1 if any differs; timings never change it.

Then each target with OK/MISS (informational): step and chunk time at the largest N over the
smallest (<= 1.1), construction per run likewise (<= 1.2), wall RF/seq at N >= 128 (<= 0.6,
tiny workload), first metrics within 1.3x the bound. The sweep prints per ``num_chunks`` the
wall, step time, both shares and the wall against ``num_chunks=2``, targets share <= 10% with
1-step chunks and <= 1% at 2 chunks and wall(1-step chunks) / wall(2 chunks) <= 1.1, and
checks the final adapters are bitwise equal across chunk counts (exit status 1 if not).

Boundary checkpoints: ``RFSFTConfig.checkpoint_every`` defaults to a time (60 s of a run's
training), so these short runs write none (``checkpoints`` 0 in the JSON);
``--checkpoint-every chunk`` writes one at every boundary, the most a turn can cost.

Usage::

    python benchmarks/scaling.py --quick                      # N = 4, 16; 4 steps (~2 min)
    python benchmarks/scaling.py --threads 1                  # N = 8 .. 512
    python benchmarks/scaling.py --threads 1 --repeat 3       # medians of 3 processes per N
    python benchmarks/scaling.py --real-shape --threads 1     # N = 8, 32 at 135M's shape
    python benchmarks/scaling.py --chunks-sweep --threads 1   # 8 configs, 2 / 8 / 32 chunks
    python benchmarks/scaling.py --chunks-sweep --quick       # 4 configs x 8 steps, 2 / 8
    python benchmarks/scaling.py --chunks-sweep --checkpoint-every chunk --json sweep.json

Runs offline on CPU (``HF_HUB_OFFLINE=1``). On a CPU shared with busy processes (load average
above the core count, printed) timings swing; prefer ``--threads 1`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

BATCH_SIZE = 8  # tiny workload
TINY_TARGETS = ("q_proj", "v_proj")
TINY_RANK = 8
REAL_RANK = 16
BASE_LR = 1e-4
ADAPTER_FILE = "adapter_model.safetensors"
MIB = 1 << 20

TARGET_FLAT_STEP = 1.1  # step and chunk time, largest N / smallest N
TARGET_FLAT_CONSTRUCT = 1.2  # construction per run, largest N / smallest N
TARGET_WALL = 0.6  # RF / sequential at N >= 128 (tiny)
TARGET_FIRST = 1.3  # first metrics RF / sequential, over the bound
TARGET_SHARE_1STEP = 0.10  # sweep: overhead share with 1-step chunks
TARGET_SHARE_2CHUNKS = 0.01  # sweep: overhead share at 2 chunks
TARGET_SWEEP_WALL = 1.1  # sweep: wall(1-step chunks) / wall(2 chunks)

# ---------------------------------------------------------------------------- step clock

# Measurements live here, not on the callback: every run's trainer gets a deep copy of it.
SUSPENSIONS = {"count": 0}  # Turns.end_turn calls so far (a run suspended)
STEP_BEGAN: dict[str, tuple[float, int]] = {}  # run dir -> (perf_counter, SUSPENSIONS)
STEP_TIMES: dict[str, list[float]] = {}  # run dir -> kept steps after its first (s)
FIRST_STEP: dict[str, float] = {}  # run dir -> its first step (s), if kept
DROPPED = {"count": 0}  # steps that held a suspension and were not restarted (not expected)
# The remainder of each step that began a turn, from the run's resumption to on_step_end
# (what such a step costs once the run is back; the only step figure with 1-step chunks).
RESUMED_TIMES: list[float] = []


def reset_clock() -> None:
    STEP_BEGAN.clear()
    STEP_TIMES.clear()
    FIRST_STEP.clear()
    RESUMED_TIMES.clear()
    DROPPED["count"] = 0


def count_suspensions() -> bool:
    """Wrap ``Turns.end_turn`` (called inside a run at each suspension) with a counter.
    Returns False where the engine has no such method (then no step is dropped)."""
    from trl_rapidfire.engine.turns import Turns

    original = getattr(Turns, "end_turn", None)
    if original is None:
        return False

    @functools.wraps(original)
    def end_turn(self: Any, slot: Any, *args: Any, **kwargs: Any) -> Any:
        SUSPENSIONS["count"] += 1
        try:
            return original(self, slot, *args, **kwargs)
        finally:  # resumed: its step goes on from here (kept apart, as RESUMED_TIMES)
            run = getattr(getattr(getattr(slot, "trainer", None), "args", None), "output_dir",
                          None)
            if run in STEP_BEGAN:
                STEP_BEGAN[run] = (time.perf_counter(), -1)

    Turns.end_turn = end_turn
    return True


@functools.cache
def _clock_class() -> type:
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        """Reads the clock only (no RNG, no state): the runs train as without it."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            STEP_BEGAN[args.output_dir] = (time.perf_counter(), SUSPENSIONS["count"])

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            began, count = STEP_BEGAN.pop(args.output_dir, (None, None))
            if began is None:
                return
            if count == -1:  # began before a suspension: from the resumption on only
                RESUMED_TIMES.append(time.perf_counter() - began)
            elif count != SUSPENSIONS["count"]:  # other runs' turns happened inside
                DROPPED["count"] += 1
            elif state.global_step == 1:
                FIRST_STEP[args.output_dir] = time.perf_counter() - began
            else:
                STEP_TIMES.setdefault(args.output_dir, []).append(time.perf_counter() - began)

    return StepClock


def step_clock() -> Any:
    return _clock_class()()


# ---------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    label: str
    model_path: str
    dataset: Any
    kwargs: dict[str, Any]  # SFTConfig values both sides share (not lr, not output_dir)
    targets: tuple[str, ...]
    rank: int
    steps: int  # per config
    rf_kwargs: dict[str, Any] = field(default_factory=dict)  # RFSFTConfig only

    def lora(self) -> Any:
        from trl_rapidfire.testing import tiny_lora_config

        return tiny_lora_config(r=self.rank, target_modules=self.targets)


def tiny_workload(steps: int) -> Workload:
    from trl_rapidfire.testing import cpu_training_kwargs, make_sft_dataset, tiny_model_path

    kwargs = dict(cpu_training_kwargs(), per_device_train_batch_size=BATCH_SIZE,
                  num_train_epochs=1, report_to="none")
    return Workload("tiny", tiny_model_path(), make_sft_dataset(steps * BATCH_SIZE), kwargs,
                    TINY_TARGETS, TINY_RANK, steps)


def real_workload(steps: int) -> Workload:
    sys.path.insert(0, str(Path(__file__).parent))
    import real_shape

    shape = real_shape.FULL
    kwargs = real_shape.training_kwargs(argparse.Namespace(batch=1, device="cpu"), shape)
    kwargs["report_to"] = "none"
    return Workload("real shape (135M)", real_shape.model_path(shape),
                    real_shape.dataset(shape, steps), kwargs, real_shape.TARGET_MODULES,
                    REAL_RANK, steps)


def learning_rates(n: int) -> list[float]:
    return [BASE_LR * (1 + i / n) for i in range(n)]


def sampled(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (first and last included)."""
    if k <= 1 or n == 1:
        return [0]
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(min(k, n))})


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Swallow what trainers print (plain TRL prints every log dict when tqdm is disabled)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


# ---------------------------------------------------------------------------- disk and RSS


def folder_bytes(root: str) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # written under a temp name, renamed, pruned
                total += os.path.getsize(os.path.join(folder, name))
    return total


class DiskWatch:
    """The peak size of ``root``, polled every 0.2 s by a thread while the body runs."""

    def __init__(self, root: str) -> None:
        self.root, self.peak = root, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _look(self) -> None:
        self.peak = max(self.peak, folder_bytes(self.root))

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._look()

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._look()  # the end state (final adapters) too


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / MIB if sys.platform == "darwin" else rss / 1024


# ---------------------------------------------------------------------------- one experiment


@dataclass
class RFRun:
    """One timed RF experiment and what it recorded."""

    begin: float  # time.time() right before construction
    construct: float
    train: float
    schedule: list[Any]
    stats: dict[str, float]
    run_of_lr: dict[float, str]
    peak_disk: int
    steps: list[float]  # kept step times after each run's first (s)
    first_steps: list[float]
    resumed: list[float]  # steps that began a turn, from the resumption on (s)
    dropped: int

    @property
    def wall(self) -> float:
        return self.construct + self.train


def engine_stats(stats: Any) -> dict[str, float]:
    names = ("wall", "compute", "switching", "turns", "checkpoints", "checkpoint_in_turn",
             "checkpoint_writing")  # new fields may come: read with defaults
    return {name: float(getattr(stats, name, 0.0) or 0.0) for name in names}


def run_rf(work: Workload, lrs: Sequence[float], chunks: int, out: str) -> RFRun:
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.shared_state.runs import RunStatus

    reset_clock()
    gc.collect()
    with quiet_stdout():
        begin, t0 = time.time(), time.perf_counter()
        trainer = RFSFTTrainer(
            model=work.model_path,
            args=RFSFTConfig(output_dir=out, num_chunks=chunks, learning_rate=List(list(lrs)),
                             **work.kwargs, **work.rf_kwargs),
            train_dataset=work.dataset, peft_config=work.lora(), callbacks=[step_clock()])
        t1 = time.perf_counter()
        with DiskWatch(out) as disk:
            trainer.train()
        t2 = time.perf_counter()
    run_of_lr = {}
    for result in trainer.runs:
        if result.status != RunStatus.COMPLETED:
            raise RuntimeError(f"RF {result.name} ended {result.status}: {result.error}")
        run_of_lr[result.knobs["learning_rate"]] = result.name
    run = RFRun(begin, t1 - t0, t2 - t1, list(trainer.schedule),
                engine_stats(trainer.engine.stats), run_of_lr, disk.peak,
                [t for times in STEP_TIMES.values() for t in times], list(FIRST_STEP.values()),
                list(RESUMED_TIMES), DROPPED["count"])
    del trainer
    gc.collect()
    return run


def run_plain(work: Workload, lr: float, out: str) -> float:
    """One config by plain TRL: construct + train + save_model (RF saves inside train())."""
    from trl import SFTConfig, SFTTrainer

    gc.collect()
    with quiet_stdout():
        t0 = time.perf_counter()
        trainer = SFTTrainer(
            model=work.model_path,
            args=SFTConfig(output_dir=out, learning_rate=lr, **work.kwargs),
            train_dataset=work.dataset, peft_config=work.lora())
        trainer.train()
        trainer.save_model(os.path.join(out, "final"))
        seconds = time.perf_counter() - t0
    del trainer
    return seconds


def compare_files(a_path: str, b_path: str) -> str | None:
    """None if the two adapters are bitwise equal, else why not."""
    from safetensors.torch import load_file

    if not os.path.exists(a_path):
        return f"no {a_path}"
    return compare_tensors(load_file(a_path), load_file(b_path))


def compare_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str | None:
    if a.keys() != b.keys():
        return "tensor names differ"
    bad = [k for k in a if a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
    return f"{len(bad)}/{len(a)} tensors differ (e.g. {bad[0]})" if bad else None


def warm_up(work: Workload) -> float:
    """Both code paths once on one step per chunk (untimed): lazy imports, first calls."""
    small = replace(work, dataset=work.dataset.select(range(2 * _batch(work))), steps=2)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rf-scaling-warmup-") as tmp:
        run_rf(small, learning_rates(2), 2, os.path.join(tmp, "rf"))
        run_plain(small, BASE_LR, os.path.join(tmp, "plain"))
    reset_clock()
    return time.perf_counter() - t0


def _batch(work: Workload) -> int:
    return int(work.kwargs.get("per_device_train_batch_size", 1))


# ---------------------------------------------------------------------------- one N


@dataclass
class Row:
    n: int
    chunks: int
    construct_s: float
    train_s: float
    wall_s: float
    construct_ms_per_run: float
    step_ms_mean: float | None
    step_ms_median: float | None
    steps_kept: int
    steps_resumed: int
    resumed_ms_mean: float | None
    steps_dropped: int
    first_step_ms: float | None
    chunk_ms: float
    # By position in its run: the first holds its train()'s start (a gc.collect over the
    # process, the optimizer), the last its final weights' write; the middle ones neither.
    chunk_ms_first: float | None
    chunk_ms_middle: float | None
    chunk_ms_last: float | None
    gap_ms: float
    handoff_share: float
    engine: dict[str, float]
    switch_share: float | None  # switching / compute
    sampled: list[int]
    baseline_s: list[float]  # per sampled config: construct + train + save
    t_cfg_s: float
    seq_wall_extrapolated_s: float
    wall_ratio: float
    rf_first_s: float
    seq_first_s: float
    first_ratio: float
    bound: float
    first_over_bound: float
    peak_rss_mib: float
    peak_disk_mib: float
    bitwise_equal: int
    bitwise_total: int
    differ: list[str] = field(default_factory=list)


def shares(stats: dict[str, float]) -> float | None:
    """Switching over compute (switching holds the boundary checkpoints' in-turn time)."""
    return stats["switching"] / stats["compute"] if stats["compute"] else None


def ms(values: Sequence[float], how: Any = statistics.mean) -> float | None:
    return 1000 * how(values) if values else None


def chunk_positions(schedule: Sequence[Any]) -> dict[str, float | None]:
    """Mean chunk ms of each run's first chunk, of its last, and of those in between."""
    last = {}
    for r in schedule:
        last[r.run] = max(last.get(r.run, 0), r.number)
    groups: dict[str, list[float]] = {"first": [], "middle": [], "last": []}
    for r in schedule:
        where = "first" if r.number == 0 else "last" if r.number == last[r.run] else "middle"
        groups[where].append(r.end_time - r.start_time)
    return {f"chunk_ms_{k}": ms(v) for k, v in groups.items()}


def first_metrics(rf: RFRun, n: int) -> float:
    """Seconds from just before construction until every run's chunk 0 had ended."""
    ends = {r.run: r.end_time for r in rf.schedule if r.number == 0}
    if len(ends) != n:
        raise RuntimeError(f"schedule has a first chunk for {len(ends)} of {n} runs")
    return max(ends.values()) - rf.begin


def baseline(work: Workload, lrs: list[float], picks: list[int], rf: RFRun, out: str,
             rf_out: str) -> tuple[list[float], list[str]]:
    """Train the sampled configs by plain TRL; compare each with its RF run's adapter."""
    seconds, differ = [], []
    for i in picks:
        plain_dir = os.path.join(out, f"plain-{i}")
        seconds.append(run_plain(work, lrs[i], plain_dir))
        name = rf.run_of_lr.get(lrs[i])
        why = (f"no RF run has learning_rate {lrs[i]!r}" if name is None else compare_files(
            os.path.join(rf_out, "runs", name, "final", ADAPTER_FILE),
            os.path.join(plain_dir, "final", ADAPTER_FILE)))
        if why:
            differ.append(f"lr index {i} (lr={lrs[i]:.6g}, {name}): {why}")
        shutil.rmtree(plain_dir, ignore_errors=True)
    return seconds, differ


def measure(work: Workload, n: int, chunks: int, k: int, out: str) -> Row:
    from trl_rapidfire.storage.schedule import Handoffs

    lrs, picks = learning_rates(n), sampled(n, k)
    rf_out = os.path.join(out, "rf")
    rf = run_rf(work, lrs, chunks, rf_out)
    print(f"  N={n:<4d} RF construct {rf.construct:7.2f} s ({1000 * rf.construct / n:.1f} ms "
          f"per run), train {rf.train:7.2f} s", flush=True)
    seconds, differ = baseline(work, lrs, picks, rf, out, rf_out)
    t_cfg = statistics.mean(seconds)
    print(f"  N={n:<4d} baseline {len(picks)} sampled config(s): {t_cfg:.2f} s each "
          f"(construct + train + save)", flush=True)
    hand = Handoffs.of(rf.schedule)
    plain = shares(rf.stats)
    rf_first, seq_first = first_metrics(rf, n), (n - 1) * t_cfg + t_cfg / chunks
    bound = n / (chunks * (n - 1) + 1)
    first_ratio = rf_first / seq_first
    return Row(
        n=n, chunks=chunks, construct_s=rf.construct, train_s=rf.train, wall_s=rf.wall,
        construct_ms_per_run=1000 * rf.construct / n, step_ms_mean=ms(rf.steps),
        step_ms_median=ms(rf.steps, statistics.median), steps_kept=len(rf.steps),
        steps_resumed=len(rf.resumed), resumed_ms_mean=ms(rf.resumed),
        steps_dropped=rf.dropped, first_step_ms=ms(rf.first_steps),
        chunk_ms=1000 * hand.busy / max(hand.chunks, 1), gap_ms=1000 * hand.mean_gap,
        **chunk_positions(rf.schedule),
        handoff_share=hand.share, engine=rf.stats, switch_share=plain, sampled=picks,
        baseline_s=seconds, t_cfg_s=t_cfg,
        seq_wall_extrapolated_s=t_cfg * n, wall_ratio=rf.wall / (t_cfg * n),
        rf_first_s=rf_first, seq_first_s=seq_first, first_ratio=first_ratio, bound=bound,
        first_over_bound=first_ratio / bound, peak_rss_mib=peak_rss_mib(),
        peak_disk_mib=rf.peak_disk / MIB, bitwise_equal=len(picks) - len(differ),
        bitwise_total=len(picks), differ=differ,
    )  # fmt: skip


# ---------------------------------------------------------------------------- reporting


def fmt(value: float | None, spec: str) -> str:
    width = len(format(0.0, spec))
    return format(value, spec) if value is not None else "-".rjust(width)


def pct(value: float | None) -> float | None:
    return None if value is None else 100 * value


def print_table(rows: list[Row]) -> None:
    header = (f"{'N':>5} {'constr':>7} {'step':>7} {'step':>7} {'first':>7} {'chunk':>8} "
              f"{'gap':>6} {'sw/comp':>7} {'wall':>7} {'1st':>6} {'bound':>6} "
              f"{'/bound':>6} {'RSS':>7} {'disk':>7} {'bitwise':>7}")
    units = (f"{'':>5} {'ms/run':>7} {'mean ms':>7} {'med ms':>7} {'step ms':>7} {'ms':>8} "
             f"{'ms':>6} {'%':>7} {'RF/seq*':>7} {'RF/seq':>6} {'':>6} {'':>6} "
             f"{'MiB':>7} {'MiB':>7} {'k/K':>7}")
    print(header)
    print(units)
    print("-" * len(header))
    for r in rows:
        print(f"{r.n:>5} {r.construct_ms_per_run:7.1f} {fmt(r.step_ms_mean, '7.2f')} "
              f"{fmt(r.step_ms_median, '7.2f')} {fmt(r.first_step_ms, '7.1f')} "
              f"{r.chunk_ms:8.1f} {r.gap_ms:6.2f} {fmt(pct(r.switch_share), '7.2f')} "
              f"{r.wall_ratio:7.3f} "
              f"{r.first_ratio:6.3f} {r.bound:6.3f} {r.first_over_bound:6.2f} "
              f"{r.peak_rss_mib:7.0f} {r.peak_disk_mib:7.1f} "
              f"{f'{r.bitwise_equal}/{r.bitwise_total}':>7}")
    print("* wall RF/seq: the sequential side is EXTRAPOLATED (mean of the sampled configs x N).")
    print("  RSS is the process's peak so far; disk is output_dir's peak during train().")
    print("  chunk ms by position in its run (first: its train() starts; last: its final "
          "weights are written):")
    for r in rows:
        print(f"    N={r.n}: first {fmt(r.chunk_ms_first, '.1f')}, middle "
              f"{fmt(r.chunk_ms_middle, '.1f')}, last {fmt(r.chunk_ms_last, '.1f')}")
    print("  step mean/med leave out each run's first step and the steps that began a turn "
          "(timed apart, from the run's resumption on):")
    for r in rows:
        print(f"    N={r.n}: {r.steps_kept} steps kept; {r.steps_resumed} began a turn, "
              f"{fmt(r.resumed_ms_mean, '.2f')} ms each from the resumption"
              + (f"; {r.steps_dropped} dropped (held a suspension)" if r.steps_dropped else ""))


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "OK" if ok else "MISS"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def target_lines(rows: list[Row], tiny: bool) -> list[dict[str, Any]]:
    lo, hi = rows[0], rows[-1]
    span = f"N={hi.n} / N={lo.n}"
    big = [r for r in rows if r.n >= 128]
    worst_first = max(rows, key=lambda r: r.first_over_bound)
    out = [
        ("step time (mean), " + span, ratio(hi.step_ms_mean, lo.step_ms_mean), TARGET_FLAT_STEP),
        ("chunk (turn) time, " + span, ratio(hi.chunk_ms, lo.chunk_ms), TARGET_FLAT_STEP),
        ("  the same, middle chunks only, " + span,
         ratio(hi.chunk_ms_middle, lo.chunk_ms_middle), TARGET_FLAT_STEP),
        ("construction per run, " + span, ratio(hi.construct_ms_per_run,
                                                lo.construct_ms_per_run),
         TARGET_FLAT_CONSTRUCT),
        (f"wall RF / seq (extrapolated) at N>=128 (worst{'' if tiny else '; tiny target'})",
         max((r.wall_ratio for r in big), default=None), TARGET_WALL),
        (f"first metrics RF/seq over the bound (worst: N={worst_first.n})",
         worst_first.first_over_bound, TARGET_FIRST),
    ]
    return [{"what": w, "value": v, "target": t, "ok": None if v is None else v <= t}
            for w, v, t in out]


def print_targets(targets: list[dict[str, Any]]) -> None:
    for t in targets:
        print(f"  {t['what']:<62s} {fmt(t['value'], '7.3f')}  target <= {t['target']:<5g} "
              f"[{verdict(t['ok'])}]")


# ---------------------------------------------------------------------------- the modes


def in_children(args: argparse.Namespace) -> bool:
    """Whether each N (or each ``num_chunks`` of the sweep) runs in a process of its own
    (see ``--one-process``)."""
    many = args.sweep_chunks if args.chunks_sweep else args.configs
    return not args.one_process and len(many) > 1


def child_argv(args: argparse.Namespace, json_path: str) -> list[str]:
    """This script's command line for one child: the settings that shape the workload."""
    argv = [sys.executable, os.path.abspath(__file__), "--json", json_path]
    for flag, value in (("--threads", args.threads), ("--cache-budget", args.cache_budget),
                        ("--checkpoint-every", args.checkpoint_every)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + ["--real-shape"] * args.real_shape + ["--quick"] * args.quick


def child_row(args: argparse.Namespace, n: int) -> Row:
    """Measure N = ``n`` in a fresh process (its own baseline inside it) and take its row."""
    with tempfile.TemporaryDirectory(prefix="rf-scaling-child-") as folder:
        path = os.path.join(folder, "row.json")
        argv = child_argv(args, path) + [
            "--configs", str(n), "--steps", str(args.steps), "--chunks", str(args.chunks),
            "--sample", str(args.sample)] + ["--keep"] * args.keep
        print(f"  N={n}: in a process of its own", flush=True)
        done = subprocess.run(argv, check=False)
        if done.returncode not in (0, 1) or not os.path.exists(path):
            raise SystemExit(f"the process measuring N={n} failed (exit {done.returncode})")
        with open(path, encoding="utf-8") as f:
            return Row(**json.load(f)["rows"][0])


def median_row(rows: list[Any]) -> Any:
    """One N's (or one ``num_chunks``') row over ``--repeat`` processes: each timing the
    median of the processes', the weights' check over all of them."""
    if len(rows) == 1:
        return rows[0]
    merged = asdict(rows[len(rows) // 2])
    for name, value in merged.items():
        values = [getattr(r, name) for r in rows]
        if name in ("bitwise_equal", "bitwise_total"):
            merged[name] = sum(values)
        elif name == "differ":
            merged[name] = [line for r in rows for line in r.differ]
        elif name == "engine":
            merged[name] = {k: statistics.median(r.engine[k] for r in rows) for k in value}
        elif isinstance(value, float) and None not in values:
            merged[name] = statistics.median(values)
    return type(rows[0])(**merged)


def scaling(args: argparse.Namespace, work: Workload) -> tuple[dict[str, Any], int]:
    rows: list[Row] = []
    if in_children(args):
        # Interleaved (8, 32, ..., 8, 32, ...): a machine's load drifting over minutes
        # weighs on every N alike.
        runs: dict[int, list[Row]] = {n: [] for n in args.configs}
        for _ in range(args.repeat):
            for n in args.configs:
                runs[n].append(child_row(args, n))
        rows = [median_row(runs[n]) for n in args.configs]
    for n in args.configs if not in_children(args) else ():
        out = tempfile.mkdtemp(prefix=f"rf-scaling-n{n}-")
        try:
            rows.append(measure(work, n, args.chunks, args.sample, out))
        finally:
            if args.keep:
                print(f"  kept {out}")
            else:
                shutil.rmtree(out, ignore_errors=True)
    print()
    print_table(rows)
    differ = [f"N={r.n} {line}" for r in rows for line in r.differ]
    total = sum(r.bitwise_total for r in rows)
    print(f"weights: bitwise equal for {total - len(differ)}/{total} sampled configs"
          + ("; differing:" if differ else ""))
    for line in differ:
        print(f"  {line}")
    print("targets (informational; the exit status depends on the weights only):")
    targets = target_lines(rows, tiny=not args.real_shape)
    print_targets(targets)
    return {"rows": [asdict(r) for r in rows], "targets": targets}, 1 if differ else 0


@dataclass
class SweepRow:
    chunks: int
    wall_s: float
    construct_s: float
    train_s: float
    step_ms_mean: float | None
    resumed_ms_mean: float | None
    switch_share: float | None
    gap_ms: float
    engine: dict[str, float]
    wall_vs_first: float = 0.0
    run_of_lr: dict[str, str] = field(default_factory=dict)  # repr(lr) -> run name


def sweep(args: argparse.Namespace, work: Workload) -> tuple[dict[str, Any], int]:
    from trl_rapidfire.storage.schedule import Handoffs

    lrs = learning_rates(args.sweep_configs)
    rows: list[SweepRow] = []
    first_adapters: dict[str, dict[str, torch.Tensor]] = {}
    differ: list[str] = []
    root = args.out_root or tempfile.mkdtemp(prefix="rf-scaling-sweep-")
    measured: dict[int, list[SweepRow]] = {c: [] for c in args.sweep_chunks}
    try:
        # Interleaved over --repeat (2, 8, 32, 2, 8, 32, ...): a drifting load weighs alike.
        for r in range(args.repeat):
            for chunks in args.sweep_chunks:
                where = os.path.join(root, f"r{r}") if in_children(args) else root
                out = os.path.join(where, f"c{chunks}")
                if in_children(args):
                    row = sweep_child(args, chunks, where)
                else:
                    os.makedirs(out)
                    rf = run_rf(work, lrs, chunks, out)
                    row = SweepRow(chunks, rf.wall, rf.construct, rf.train, ms(rf.steps),
                                   ms(rf.resumed), shares(rf.stats),
                                   1000 * Handoffs.of(rf.schedule).mean_gap, rf.stats,
                                   run_of_lr={repr(lr): n for lr, n in rf.run_of_lr.items()})
                differ += sweep_compare(row.run_of_lr, out, chunks, first_adapters)
                measured[chunks].append(row)
                print(f"  num_chunks={chunks:<3d} wall {row.wall_s:7.2f} s", flush=True)
        rows = [median_row(measured[c]) for c in args.sweep_chunks]
    finally:
        if args.keep:
            print(f"  kept {root}")
        elif not args.out_root:
            shutil.rmtree(root, ignore_errors=True)
    for r in rows:
        r.wall_vs_first = r.wall_s / rows[0].wall_s
    print_sweep(rows, args.sweep_steps)
    targets = sweep_targets(rows, args.sweep_steps)
    print_targets(targets)
    equal = len(lrs) - len({line.split(':')[0] for line in differ})
    print(f"weights: final adapters bitwise equal across num_chunks for {equal}/{len(lrs)} "
          "configs" + ("; differing:" if differ else ""))
    for line in differ:
        print(f"  {line}")
    return ({"rows": [asdict(r) for r in rows], "targets": targets, "differ": differ},
            1 if differ else 0)


def sweep_child(args: argparse.Namespace, chunks: int, root: str) -> SweepRow:
    """Train the sweep's ``num_chunks=chunks`` in a fresh process, its runs under
    ``root/c<chunks>`` (kept for the comparison of the final adapters)."""
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"c{chunks}.json")
    argv = child_argv(args, path) + ["--chunks-sweep", "--sweep-chunks", str(chunks),
                                     "--out-root", root]
    print(f"  num_chunks={chunks}: in a process of its own", flush=True)
    done = subprocess.run(argv, check=False)
    if done.returncode not in (0, 1) or not os.path.exists(path):
        raise SystemExit(f"the process measuring num_chunks={chunks} failed "
                         f"(exit {done.returncode})")
    with open(path, encoding="utf-8") as f:
        return SweepRow(**json.load(f)["rows"][0])


def sweep_compare(run_of_lr: dict[str, str], out: str, chunks: int,
                  first: dict[str, dict[str, torch.Tensor]]) -> list[str]:
    """Every config's final adapter must not depend on how its training was chunked."""
    from safetensors.torch import load_file

    differ = []
    for lr, name in sorted(run_of_lr.items(), key=lambda item: float(item[0])):
        tensors = load_file(os.path.join(out, "runs", name, "final", ADAPTER_FILE))
        if lr not in first:
            first[lr] = tensors
        elif why := compare_tensors(tensors, first[lr]):
            differ.append(f"lr={float(lr):.6g}: num_chunks={chunks} vs the first: {why}")
    return differ


def print_sweep(rows: list[SweepRow], steps: int) -> None:
    print()
    print(f"{'num_chunks':>10} {'steps/chunk':>11} {'wall s':>8} {'step ms':>8} "
          f"{'resumed':>8} {'gap ms':>7} {'sw/comp %':>9} {'wall / first':>12}")
    for r in rows:
        print(f"{r.chunks:>10} {steps / r.chunks:>11.1f} {r.wall_s:8.2f} "
              f"{fmt(r.step_ms_mean, '8.2f')} {fmt(r.resumed_ms_mean, '8.2f')} "
              f"{r.gap_ms:7.2f} {fmt(pct(r.switch_share), '9.2f')} {r.wall_vs_first:12.3f}")
    print("step ms: steps inside a turn (none with 1-step chunks); resumed: the steps that "
          "began a turn, from the run's resumption on; gap: schedule.csv, between chunks")
    print("sw/comp: switching (boundary checkpoints in the turn included) over compute")
    print("targets (informational):")


def sweep_targets(rows: list[SweepRow], steps: int) -> list[dict[str, Any]]:
    by = {r.chunks: r for r in rows}
    one, two = by.get(steps), by.get(2)
    out = [
        (f"sw/comp share with 1-step chunks (num_chunks={steps})",
         one and one.switch_share, TARGET_SHARE_1STEP),
        ("sw/comp share at num_chunks=2", two and two.switch_share, TARGET_SHARE_2CHUNKS),
        (f"wall(num_chunks={steps}) / wall(num_chunks=2)",
         one.wall_s / two.wall_s if one and two else None, TARGET_SWEEP_WALL),
    ]
    return [{"what": w, "value": v, "target": t, "ok": None if v is None else v <= t}
            for w, v, t in out]


# ---------------------------------------------------------------------------- main


def int_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError("a comma-separated list of integers >= 2")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", type=int_list, default=None,
                        help="Ns to run, increasing (default 8,32,128,512; --quick 4,16; "
                             "--real-shape 8,32)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per config (default 8; --quick and --real-shape 4)")
    parser.add_argument("--chunks", type=int, default=None,
                        help="num_chunks (default 4; --quick and --real-shape 2)")
    parser.add_argument("--sample", type=int, default=None,
                        help="configs trained by plain TRL per N as the baseline (default 4; "
                             "--quick 2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's count at start)")
    parser.add_argument("--quick", action="store_true", help="smoke test (also of the sweep)")
    parser.add_argument("--real-shape", action="store_true",
                        help="the 135M-shape Llama of real_shape.py instead of the tiny model")
    parser.add_argument("--chunks-sweep", action="store_true",
                        help="8 configs x 32 steps with num_chunks 2, 8, 32 (--quick: 4 x 8 "
                             "steps, num_chunks 2, 8)")
    parser.add_argument("--cache-budget", type=int, metavar="BYTES",
                        help="RFSFTConfig.cache_budget_bytes (0: every idle run parked to "
                        "disk; default: the config's)")
    parser.add_argument("--checkpoint-every", metavar="WHEN",
                        help='RFSFTConfig.checkpoint_every, e.g. "chunk" (default: the '
                             "config's, a time: short runs then write no boundary checkpoint)")
    parser.add_argument("--one-process", action="store_true",
                        help="every N in this process, one after another (default: each N in "
                             "a fresh process with its own baseline: a process that trained "
                             "the smaller Ns before is slower by itself, by up to 20%%)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure every N in this many fresh processes, interleaved, and "
                             "print the median of each figure (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the output folders")
    # What the parent passes a child of the sweep (not for people).
    parser.add_argument("--sweep-chunks", type=int_list, help=argparse.SUPPRESS)
    parser.add_argument("--out-root", help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="PATH", help="also write every figure to PATH")
    args = parser.parse_args(argv)
    if args.chunks_sweep and args.real_shape:
        parser.error("--chunks-sweep runs the tiny model: leave out --real-shape")
    real, quick = args.real_shape, args.quick
    if args.configs is None:
        args.configs = [8, 32] if real else [4, 16] if quick else [8, 32, 128, 512]
    args.steps = args.steps or (4 if real or quick else 8)
    args.chunks = args.chunks or (2 if real or quick else 4)
    args.sample = args.sample or (2 if quick else 4)
    args.sweep_configs, args.sweep_steps = (4, 8) if quick else (8, 32)
    args.sweep_chunks = args.sweep_chunks or ([2, 8] if quick else [2, 8, 32])
    if args.configs != sorted(args.configs):
        parser.error("--configs must increase")
    if min(args.steps, args.chunks, args.sample, args.repeat) < 1 or (args.threads or 1) < 1:
        parser.error("--steps, --chunks, --sample, --repeat and --threads must be at least 1")
    if args.repeat > 1 and not in_children(args):
        parser.error("--repeat measures in fresh processes: leave out --one-process (and "
                     "give more than one N)")
    return args


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads_at_start = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)  # before anything else runs
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets
    import transformers
    import trl

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    if not count_suspensions():
        print("WARNING: Turns.end_turn not found: steps that hold a suspension are not dropped")
    sweep_mode = args.chunks_sweep
    steps = args.sweep_steps if sweep_mode else args.steps
    work = real_workload(steps) if args.real_shape else tiny_workload(steps)
    if args.checkpoint_every is not None:
        work.rf_kwargs["checkpoint_every"] = args.checkpoint_every
    if args.cache_budget is not None:
        work.rf_kwargs["cache_budget_bytes"] = args.cache_budget
    load_start = load_average()
    print("trl-rapidfire scaling benchmark" + (" (num_chunks sweep)" if sweep_mode else ""))
    print_header(args, work, threads_at_start, load_start, trl.__version__)
    if not in_children(args):
        print(f"  warm-up  : {warm_up(work):.2f} s (untimed)", flush=True)
    figures, status = (sweep if sweep_mode else scaling)(args, work)
    load_end = load_average()
    print(f"(load average at the end: {load_end})")
    if args.json:
        report = {"mode": "chunks-sweep" if sweep_mode else "scaling", "workload": work.label,
                  "args": {k: v for k, v in vars(args).items() if k != "json"},
                  "threads": torch.get_num_threads(), "threads_at_start": threads_at_start,
                  "cpu_count": os.cpu_count(),
                  "load_average": {"start": load_start, "end": load_end}, **figures}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=float)
        print(f"wrote {args.json}")
    return status


def print_header(args: argparse.Namespace, work: Workload, threads_at_start: int,
                 load: float | None, trl_version: str) -> None:
    if args.chunks_sweep:
        shape = (f"{args.sweep_configs} configs x {args.sweep_steps} steps, num_chunks "
                 f"{', '.join(map(str, args.sweep_chunks))}")
    else:
        shape = (f"N = {', '.join(map(str, args.configs))}; {work.steps} steps/config in "
                 f"{args.chunks} chunks; baseline: {args.sample} sampled config(s) per N")
    print(f"  workload : {work.label}, batch {_batch(work)}, LoRA r{work.rank} on "
          f"{', '.join(work.targets)}; {shape}")
    every = work.rf_kwargs.get("checkpoint_every", "<the config's default>")
    budget = work.rf_kwargs.get("cache_budget_bytes", "<the config's default>")
    print(f"  RF       : checkpoint_every={every}; cache_budget_bytes={budget}; report_to=none")
    print(f"  threads  : torch {torch.get_num_threads()} (at start {threads_at_start}); "
          f"{os.cpu_count()} CPUs; load average {load} at start")
    print(f"  versions : python {platform.python_version()}, torch {torch.__version__}, "
          f"trl {trl_version}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
