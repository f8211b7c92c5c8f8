"""Real-shape benchmark: 8 LoRA configs at SmolLM2-135M's shape, RF against plain TRL.

Workload (pinned): a Llama built in code with random weights (seed 0) at SmolLM2-135M's shape
(hidden 576, intermediate 1536, 30 layers, 9 attention / 3 KV heads, vocab 49,152, tied
embeddings; 134.5M parameters, fp32) with a byte-level BPE tokenizer of exactly 49,152 tokens
trained on generated pseudo-words, saved once under ``<temp dir>/trl-rapidfire-real-shape/``;
generated rows truncated to ``max_length=256``; batch 1, 8 steps per config, 1 epoch. 8 LoRA
configs: rank 8, 16 (alpha 2r, no dropout; q, k, v, o_proj) x lr 1e-4, 3e-4, 1e-3, 3e-3.

A: ONE ``RFSFTTrainer`` over the 8 configs, ``num_chunks=8`` (one step a chunk: a few seconds
each; with N configs and c chunks every config has a metric after N/c configs' worth of
training, against N-1 plus 1/c for the baseline, so 1.2/N needs c of about 8). B: the 8
configs back to back by plain ``SFTTrainer`` (each loads the model, trains, saves its
adapter). The sides alternate A B A B (``--repeats`` pairs, default 2; a side takes minutes)
and each side's best repetition is reported (a machine whose load falls over the run would
otherwise favour whichever side always ran second), each in a process of its own so that its
peak RSS is its own; all are forked from one forkserver that imported torch, transformers,
TRL and trl-rapidfire once. Each pair's step-time ratio is printed too.

Printed: ``wall RF / baseline`` (a side's time from its first trainer's construction to its
last adapter written); the floor under that ratio (the baseline's time inside its training
steps, from ``on_step_begin`` to ``on_step_end``, over its wall: what an RF side that spent
nothing besides the same steps would reach), with each side's time inside and outside its
steps; the switching share from ``schedule.csv`` (gaps between one chunk's
end and the next one's start over the sum of chunk durations) and ms per turn, with
``rf.engine.stats`` beside it; the time until every config has its first chunk's metric (RF:
the last first-chunk end in ``schedule.csv``; B: when config 8 ends the same step, from a
callback's step clock; both from the side's start) and their ratio; the boundary checkpoints'
count, bytes, peak folder size and time (in the run's turn and on the background writer, from
``EngineStats``); each side's
peak RSS (``ru_maxrss``); and ``bitwise equal for N/N runs``: each RF final adapter against
the baseline's, ``torch.equal`` tensor for tensor from the files. Exit status 1 if any differs.

Usage::

    python benchmarks/real_shape.py --quick         # 2 layers, hidden 64, vocab 1,000, 2 configs
    python benchmarks/real_shape.py --threads 1     # the full size, 2 pairs (~20 min)
    python benchmarks/real_shape.py --device cuda   # also GPU busy time (untested here)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared modules
from step_clock import StepClock, clock_rf_runs  # noqa: E402

LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3)
LORA_RANKS = (8, 16)
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
NUM_CHUNKS = 8
SEED = 0
ADAPTER_FILE = "adapter_model.safetensors"
RECIPE = "1"  # bump when the model, tokenizer or text recipe changes: keys the cache folder


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    seq: int
    corpus_lines: int  # tokenizer training text: enough lines for the BPE to reach `vocab`

    @property
    def key(self) -> str:  # the cache folder's name: every field, the seed and the recipe
        return "-".join(["llama", *(f"{k}{v}" for k, v in asdict(self).items()), f"seed{SEED}",
                         f"r{RECIPE}"])


FULL = Shape(576, 1536, 30, 9, 3, 49_152, 256, corpus_lines=20_000)  # SmolLM2-135M
QUICK = Shape(64, 128, 2, 4, 2, 1_000, 64, corpus_lines=2_000)


def grid(quick: bool) -> list[tuple[float, int]]:
    """(learning rate, rank) in RF's run order (config fields, then trainer knobs; the last
    varies fastest): run-0 = (1e-4, 8), run-1 = (1e-4, 16), ..."""
    lrs = LEARNING_RATES[:1] if quick else LEARNING_RATES
    return [(lr, r) for lr in lrs for r in LORA_RANKS]


def _lexicon(seed: int) -> list[str]:
    """60,000 pseudo-words of 1-4 syllables: enough distinct pairs for ~50k BPE merges."""
    rng = random.Random(seed)
    cons, vowels = "bcdfghjklmnprstvwz", "aeiou"
    syllables = sorted({c + v + rng.choice(["", "", *cons]) for c in cons for v in vowels})
    return ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(60_000)]


def _lines(n: int, words: int, seed: int) -> list[str]:
    lexicon, rng = _lexicon(SEED), random.Random(seed)  # one lexicon, many streams
    return [" ".join(rng.choice(lexicon) for _ in range(words)) for _ in range(n)]


def build_tokenizer(shape: Shape) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab, special_tokens=["<pad>", "<s>", "<|eot|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(_lines(shape.corpus_lines, 100, seed=1), trainer=trainer)
    # The embedding and LM head's cost is the point: a tokenizer short of the vocabulary
    # would make a smaller model than the one named.
    if backend.get_vocab_size() != shape.vocab:
        raise RuntimeError(f"BPE reached {backend.get_vocab_size()} tokens, not {shape.vocab}")
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="<|eot|>",
                                   pad_token="<pad>", model_max_length=shape.seq)


def model_path(shape: Shape) -> str:
    """The saved model and tokenizer of ``shape``, built on first use (atomically)."""
    root = Path(tempfile.gettempdir()) / "trl-rapidfire-real-shape"
    path = root / shape.key
    if (path / "config.json").exists():
        return str(path)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{shape.key}.tmp-", dir=root))
    try:
        tokenizer = build_tokenizer(shape)
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=shape.hidden,
            intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
            max_position_embeddings=8192, tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            LlamaForCausalLM(config).to(torch.float32).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            os.rename(staging, path)
        except OSError:  # another process won the race: use its copy
            if not (path / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(path)


def dataset(shape: Shape, rows: int) -> Any:
    from datasets import Dataset

    # A pseudo-word is one token or more, so shape.seq + 8 words fill max_length: every row
    # is truncated to exactly shape.seq tokens and no batch carries padding.
    return Dataset.from_dict({"text": _lines(rows, shape.seq + 8, seed=2)})


def training_kwargs(args: argparse.Namespace, shape: Shape) -> dict[str, Any]:
    import torch

    from trl_rapidfire.testing import cpu_training_kwargs

    kwargs = cpu_training_kwargs()
    # logging_steps=1: every chunk, however short, ends on a logged metric.
    kwargs.update(per_device_train_batch_size=args.batch, num_train_epochs=1,
                  max_length=shape.seq, seed=SEED, logging_steps=1)
    if args.device == "cpu" and torch.cuda.is_available():  # a GPU machine's CPU run
        kwargs["use_cpu"] = True
    return kwargs


def quiet() -> contextlib.redirect_stdout:
    return contextlib.redirect_stdout(io.StringIO())  # TRL prints log dicts when tqdm is off


# ---------------------------------------------------------------------------- the sides


class GpuBusy:
    """UNTESTED HERE (no GPU): samples ``torch.cuda.utilization()`` (needs pynvml) every 50 ms;
    busy seconds = mean utilization x the side's wall time. Does nothing on CPU."""

    def __init__(self, device: str) -> None:
        self.device, self.samples, self.error = device, [], None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        if device == "cuda":
            self._thread.start()

    def _poll(self) -> None:
        import torch

        while not self._stop.wait(0.05):
            try:
                self.samples.append(float(torch.cuda.utilization()))
            except Exception as exc:  # no pynvml, or no NVML: say why, not a figure
                self.error = f"{type(exc).__name__}: {exc}"
                return

    def report(self, wall: float) -> dict[str, Any]:
        if self.device != "cuda":
            return {}
        import torch

        self._stop.set()
        self._thread.join()
        mean = statistics.mean(self.samples) if self.samples else None
        return {"gpu_busy_s": None if mean is None else mean / 100 * wall,
                "gpu_error": self.error, "gpu_peak_alloc": torch.cuda.max_memory_allocated()}


class CheckpointWatch:
    """The boundary checkpoints on disk, seen from outside the engine: a thread that looks at
    ``root`` every 50 ms for the peak bytes of the folder and each whole checkpoint's size (a
    ``checkpoint-<step>`` folder is whole: they are written under a temporary name). Their
    count and times come from the engine's own stats (``trainer.engine.stats``)."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak_bytes, self.sizes = root, 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _look(self) -> None:
        with contextlib.suppress(OSError):  # a folder pruned while it is measured
            self.peak_bytes = max(self.peak_bytes, _bytes(self.root))
            for folder in self.root.glob("*/checkpoint-*"):
                self.sizes.setdefault(str(folder), _bytes(folder))

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self._look()

    def report(self, stats: Any) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {"count": stats.checkpoints, "inline_s": stats.checkpoint_in_turn,
                "write_s": stats.checkpoint_writing, "peak_bytes": self.peak_bytes,
                "sizes": self.sizes}


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def side_rf(args: argparse.Namespace, shape: Shape, out: Path) -> dict[str, Any]:
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.shared_state.runs import RunStatus
    from trl_rapidfire.testing import tiny_lora_config

    configs, data = grid(args.quick), dataset(shape, args.steps * args.batch)
    path = model_path(shape)
    gpu = GpuBusy(args.device)
    with quiet():
        begin, t0 = time.time(), time.perf_counter()
        trainer = RFSFTTrainer(
            model=path,
            args=RFSFTConfig(output_dir=str(out), num_chunks=args.chunks,
                             learning_rate=List(sorted({lr for lr, _ in configs})),
                             **training_kwargs(args, shape)),
            train_dataset=data,
            peft_config=List([tiny_lora_config(r=r, target_modules=TARGET_MODULES)
                              for r in LORA_RANKS]))
        # Each run's own trainer, its chunk callback in it: the clock starts after the run's
        # turn resumes, so a step's time excludes the turns of others (step_clock.py).
        clocks = clock_rf_runs(trainer)
        watch = CheckpointWatch(out / ".rapidfire" / "checkpoints")
        t1 = time.perf_counter()
        trainer.train()
        t2 = time.perf_counter()
    for run in trainer.runs:  # run-<i> must be grid entry i: the comparison pairs them so
        knobs = (run.knobs["learning_rate"], run.knobs["peft_config"].r)
        if run.status != RunStatus.COMPLETED or knobs != configs[int(run.name[4:])]:
            raise RuntimeError(f"RF {run.name} {knobs} ended {run.status}: {run.error}")
    engine = {k: getattr(trainer.engine.stats, k) for k in ("compute", "switching", "turns")}
    return {"begin": begin, "total": t2 - t0, "construct": t1 - t0, "train": t2 - t1,
            "in_steps": sum(c.seconds for c in clocks),
            "engine": engine, "checkpoints": watch.report(trainer.engine.stats),
            **gpu.report(t2 - t0)}


def side_seq(args: argparse.Namespace, shape: Shape, out: Path) -> dict[str, Any]:
    from trl import SFTConfig, SFTTrainer

    from trl_rapidfire.testing import tiny_lora_config

    data, path = dataset(shape, args.steps * args.batch), model_path(shape)
    gpu = GpuBusy(args.device)
    configs: list[dict[str, Any]] = []
    with quiet():
        begin, t0 = time.time(), time.perf_counter()
        for i, (lr, r) in enumerate(grid(args.quick)):
            run_dir = out / f"run-{i}"
            trainer = SFTTrainer(
                model=path,
                args=SFTConfig(output_dir=str(run_dir), learning_rate=lr,
                               **training_kwargs(args, shape)),
                train_dataset=data,
                peft_config=tiny_lora_config(r=r, target_modules=TARGET_MODULES))
            clock = StepClock(trainer)  # the same clock as RF's runs
            trainer.train()
            trainer.save_model(str(run_dir / "final"))
            configs.append({"step_ends": clock.ends, "in_steps": clock.seconds})
            del trainer
        total = time.perf_counter() - t0
    return {"begin": begin, "total": total, "configs": configs, **gpu.report(total)}


def compare(rf_dir: Path, seq_dir: Path, n: int) -> list[str]:
    import torch
    from safetensors.torch import load_file

    differ = []
    for i in range(n):
        a = load_file(rf_dir / "runs" / f"run-{i}" / "final" / ADAPTER_FILE)
        b = load_file(seq_dir / f"run-{i}" / "final" / ADAPTER_FILE)
        bad = sorted(k for k in a.keys() | b.keys()
                     if k not in a or k not in b or not torch.equal(a[k], b[k]))
        if bad:
            differ.append(f"run-{i}: {len(bad)}/{len(a)} tensors differ (e.g. {bad[0]})")
    return differ


def child(args: argparse.Namespace, side: str, out: Path) -> None:
    """One side, in a process of its own; its figures go to ``<out>/result.json``."""
    # Warnings and tracebacks to a file: the parent prints its tail if the side fails.
    os.dup2(os.open(out / "stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    shape = QUICK if args.quick else FULL
    if side == "build":
        model_path(shape)
        return
    import datasets
    import torch
    import transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    result = (side_rf if side == "rf" else side_seq)(args, shape, out)
    # ru_maxrss: this process's own peak (KiB on Linux, bytes on macOS); a parent's
    # RUSAGE_CHILDREN would be the max over every child so far, not this side's.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result["peak_rss"] = rss if sys.platform == "darwin" else rss * 1024
    result["threads"] = torch.get_num_threads()
    if side == "rf":  # the schedule, read back from the file the engine wrote
        from trl_rapidfire.storage.schedule import read_schedule_csv

        result["chunks"] = [asdict(c) for c in read_schedule_csv(out / "schedule.csv")]
    else:  # B runs after A: compare its adapters with A's, from the files on disk
        result["differ"] = compare(out.parent / "A", out, len(grid(args.quick)))
    (out / "result.json").write_text(json.dumps(result, default=float), encoding="utf-8")


# ---------------------------------------------------------------------------- the parent


# The sides are forked from one forkserver that imported these once (~25 s on 2 busy cores):
# a process per side, without paying the imports per side. The forkserver runs no torch
# code before it forks (libgomp's thread pool would not survive a fork, CUDA neither).
PRELOAD = ["torch", "datasets", "transformers", "peft", "trl", "trl_rapidfire"]


def run_side(ctx: Any, side: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True)  # its pair's folder too
    t0 = time.perf_counter()
    proc = ctx.Process(target=child, args=(args, side, out), name=f"real-shape-{side}")
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        tail = (out / "stderr.txt").read_text(encoding="utf-8", errors="replace")[-4000:]
        raise SystemExit(f"side {side} failed (exit code {proc.exitcode}):\n{tail}")
    result = {} if side == "build" else json.loads((out / "result.json").read_text("utf-8"))
    return {**result, "process": time.perf_counter() - t0}


def report(args: argparse.Namespace, rf: dict[str, Any], seq: dict[str, Any], n: int) -> None:
    mib = 1 << 20
    print(f"wall       RF / baseline = {rf['total'] / seq['total']:.3f}   "
          f"({rf['total']:.1f} s / {seq['total']:.1f} s; RF construct {rf['construct']:.1f} s "
          f"+ train {rf['train']:.1f} s)")
    # What no scheduler can save: the baseline's time in its optimizer steps (forward,
    # backward, step), which RF does too; the rest of its wall is what RF can save at most.
    in_steps = sum(c["in_steps"] for c in seq["configs"])
    print(f"floor      baseline in its training steps {in_steps:.1f} s of {seq['total']:.1f} s: "
          f"an RF that cost nothing besides them would reach {in_steps / seq['total']:.3f}; "
          f"RF in its steps {rf['in_steps']:.1f} s (RF / baseline "
          f"{rf['in_steps'] / in_steps:.3f}), outside them {rf['total'] - rf['in_steps']:.1f} s "
          f"vs {seq['total'] - in_steps:.1f} s")
    from trl_rapidfire.storage.schedule import ChunkRecord, Handoffs

    chunks = sorted(rf["chunks"], key=lambda c: c["start_time"])
    hand = Handoffs.of([ChunkRecord(**c) for c in chunks])
    e = rf["engine"]
    print(f"switching  {100 * hand.share:.2f}% of chunk time from schedule.csv "
          f"({1000 * hand.mean_gap:.1f} ms per turn over {len(hand.gaps)} hand-offs, "
          f"chunks {hand.busy / hand.chunks:.2f} s each); engine.stats switching / compute = "
          f"{100 * e['switching'] / e['compute']:.2f}% ({e['turns']} turns)")
    # Every config's first chunk done: RF from schedule.csv; baseline when the last config
    # reaches the same step (the step its RF run's first chunk ended on).
    first = {c["run"]: c for c in chunks if c["number"] == 0}
    rf_first = max(c["end_time"] for c in first.values()) - rf["begin"]
    steps = first[f"run-{n - 1}"]["end_step"]
    seq_first = seq["configs"][-1]["step_ends"][str(steps)] - seq["begin"]
    print(f"first metric of all {n} configs: RF {rf_first:.1f} s, baseline {seq_first:.1f} s "
          f"(config {n} at step {steps})   RF / baseline = {rf_first / seq_first:.3f}")
    ck = rf["checkpoints"]
    sizes = sorted(ck["sizes"].values())
    each = f"{sizes[0] / mib:.2f}-{sizes[-1] / mib:.2f} MiB each" if sizes else "none seen"
    per = max(ck["count"], 1)
    print(f"checkpoints {ck['count']} at chunk boundaries, {each}, peak "
          f"{ck['peak_bytes'] / mib:.2f} MiB in .rapidfire/checkpoints (sampled every 50 ms); "
          f"{1000 * ck['inline_s'] / per:.1f} ms each in the run's turn + "
          f"{1000 * ck['write_s'] / per:.1f} ms on the writer thread "
          f"({100 * ck['inline_s'] / rf['total']:.2f}% / {100 * ck['write_s'] / rf['total']:.2f}%"
          " of RF wall)")
    print(f"peak RSS   RF {rf['peak_rss'] / mib:.0f} MiB, baseline {seq['peak_rss'] / mib:.0f} MiB "
          f"(RF / baseline = {rf['peak_rss'] / seq['peak_rss']:.2f})")
    if args.device == "cuda":  # UNTESTED HERE: no GPU on the machine this was written on
        for name, r in (("RF", rf), ("baseline", seq)):
            busy_s = r.get("gpu_busy_s")
            print(f"GPU        {name}: busy {busy_s if busy_s is None else round(busy_s, 1)} s "
                  f"of {r['total']:.1f} s, peak alloc {r.get('gpu_peak_alloc', 0) / mib:.0f} MiB"
                  + (f" ({r['gpu_error']})" if r.get("gpu_error") else ""))
    if seq["differ"]:
        print(f"weights    {n - len(seq['differ'])}/{n} runs bitwise equal; differing:\n  "
              + "\n  ".join(seq["differ"]))
    else:
        print(f"weights    bitwise equal for {n}/{n} runs (final adapters, torch.equal)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="smoke test: 2 layers, hidden 64, 2 configs")
    add("--steps", type=int, help="optimizer steps per config (default 8; 4 with --quick)")
    add("--batch", type=int, help="per-device batch size (default 1; 2 with --quick)")
    add("--chunks", type=int, help=f"num_chunks of side A (default {NUM_CHUNKS}; 4 with --quick)")
    add("--threads", type=int, help="torch.set_num_threads in each side (default: torch's)")
    add("--device", choices=("cpu", "cuda"), default="cpu",
        help="cuda: also report GPU busy time (untested on CPU-only machines)")
    add("--keep", action="store_true", help="keep the output folder (printed at the start)")
    add("--repeats", type=int, default=None,
        help="A B pairs, alternated; each side's best is reported (default 2; 1 with --quick)")
    args = parser.parse_args(argv)
    args.steps = args.steps or (4 if args.quick else 8)
    args.batch = args.batch or (2 if args.quick else 1)
    args.chunks = args.chunks or (4 if args.quick else NUM_CHUNKS)
    args.repeats = args.repeats or (1 if args.quick else 2)
    if args.chunks < 1 or args.steps < args.chunks or args.batch < 1:
        parser.error(f"--steps must be at least --chunks ({args.chunks}), --chunks and --batch "
                     "at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    import multiprocessing

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before the forkserver starts
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    shape, n = (QUICK if args.quick else FULL), len(grid(args.quick))
    tmp = Path(tempfile.mkdtemp(prefix="rf-real-shape-"))
    try:
        t0 = time.perf_counter()
        # Built (or found) in a process of its own, so neither side's peak RSS includes it.
        run_side(ctx, "build", args, tmp / "build")
        lrs = ", ".join(f"{lr:g}" for lr in sorted({lr for lr, _ in grid(args.quick)}))
        print(f"trl-rapidfire real-shape benchmark ({'quick' if args.quick else 'full'} size)\n"
              f"  model    : Llama hidden {shape.hidden}, intermediate {shape.intermediate}, "
              f"{shape.layers} layers, {shape.heads}/{shape.kv_heads} heads, vocab "
              f"{shape.vocab:,}, tied ({model_path(shape)}, {time.perf_counter() - t0:.1f} s)\n"
              f"  workload : {n} LoRA configs = lr [{lrs}] x r {list(LORA_RANKS)} on "
              f"{', '.join(TARGET_MODULES)}; seq {shape.seq}, batch {args.batch}, {args.steps} "
              f"steps/config, num_chunks={args.chunks}\n  order    : A (RFSFTTrainer) then B "
              f"(plain SFTTrainer x {n}), each in its own process; device {args.device}, threads "
              f"{args.threads or 'default'}, load avg {os.getloadavg()[0]:.2f} on "
              f"{os.cpu_count()} CPUs; output {tmp}", flush=True)
        pairs = []
        for rep in range(args.repeats):
            # A then B in each pair: B compares its adapters with its pair's A.
            rf = run_side(ctx, "rf", args, tmp / f"pair-{rep}" / "A")
            print(f"  pair {rep + 1}/{args.repeats}: A done in {rf['process']:.1f} s", flush=True)
            seq = run_side(ctx, "seq", args, tmp / f"pair-{rep}" / "B")
            print(f"  pair {rep + 1}/{args.repeats}: B done in {seq['process']:.1f} s; threads "
                  f"{rf['threads']}/{seq['threads']}, load avg {os.getloadavg()[0]:.2f}",
                  flush=True)
            pairs.append((rf, seq))
        print()
        for i, (rf, seq) in enumerate(pairs):
            in_steps = sum(c["in_steps"] for c in seq["configs"])
            print(f"pair {i + 1}    RF / baseline in steps {rf['in_steps'] / in_steps:.3f}, "
                  f"wall {rf['total'] / seq['total']:.3f}")
        # Each side's best repetition (the least wall), and the step parity of the two sides'
        # least time inside their steps.
        best_rf = min((p[0] for p in pairs), key=lambda r: r["total"])
        best_seq = min((p[1] for p in pairs), key=lambda r: r["total"])
        rf_steps = min(p[0]["in_steps"] for p in pairs)
        seq_steps = min(sum(c["in_steps"] for c in p[1]["configs"]) for p in pairs)
        print(f"best-of    RF / baseline in steps {rf_steps / seq_steps:.3f} (each side's least "
              f"time inside its steps over {args.repeats} alternated pair(s))")
        report(args, best_rf, best_seq, n)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if any(p[1]["differ"] for p in pairs) else 0


if __name__ == "__main__":
    sys.exit(main())
