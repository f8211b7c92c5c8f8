"""``trl-rapidfire doctor``: on one screen, the first hour's surprises (issue 36) that no error
catches in time, each with its fix: an untested stack, no GPU, an ``accelerate launch`` starting
one worker where two were asked for, a disk that fills up hours in, a tracking server that is
down. Nothing here imports torch, TRL or accelerate (the client's contract; a doctor must answer
when they are broken): devices come from a ``python -c`` subprocess (:func:`probe_devices`)."""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata as md
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .doctor_text import (
    Finding,
    _count,
    _flag,
    _kind,
    _read_head,
    _yaml_depth,
    printable,
)
from .doctor_tracking import HTTP_TIMEOUT, check_tracking, redact

__all__ = ["HTTP_TIMEOUT", "Devices", "Finding", "check_tracking", "main", "redact", "render"]

STACK = ("torch", "trl", "transformers", "peft", "datasets", "accelerate", "mlflow", "filelock")
PROBE_TIMEOUT = 60.0
MAX_CONFIG_BYTES = 64 * 1024  # accelerate's own configs are a few hundred bytes
# No machine carries more accelerators than this, and each worker needs a core of its own: a
# count above it is a typo (or 10**26), not a plan. Machines: more than the largest clusters.
MAX_WORKERS_PER_MACHINE, MAX_MACHINES = 256, 100_000
GIB = 1024**3
MIN_FREE_DISK, MIN_FREE_SHM = 10 * GIB, 1 * GIB
# The distributed_types `accelerate launch` (1.15, launch.py) starts num_processes workers for;
# any other (MULTI_CPU too, unless mpirun has a hostfile) gets its simple launcher: one process.
# _CPU_LAUNCH starts N on a CPU-only machine (as tests/engine/test_workers_and_crashes.py does).
_MANY = {"MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU",
         "MULTI_HPU", "MULTI_NEURON", "FSDP", "DEEPSPEED", "MEGATRON_LM"}
_CPU_LAUNCH = ("OMP_NUM_THREADS=1 accelerate launch --multi_gpu --num_processes {n} "
               "--num_machines 1 --mixed_precision no --dynamo_backend no my_experiment.py "
               "(`--cpu --num_processes {n}` starts one)")
_PROBE = ("import json, torch; c = torch.cuda; ok = c.is_available(); p = [c.get_device_properties"
          "(i) for i in range(c.device_count() if ok else 0)]; print(json.dumps({'cuda': ok, "
          "'gpus': [[d.name, d.total_memory] for d in p]}))")


@dataclass(frozen=True)
class Devices:
    """What torch sees, as the probe subprocess printed it; ``error`` when it could not say."""

    cuda: bool = False
    gpus: tuple[tuple[str, int], ...] = ()  # (name, total memory in bytes)
    error: str | None = None


def tested_versions(checkout: Path | None = None) -> dict[str, str]:
    """Distribution -> the specifier it is tested with: the pin in ``constraints.txt`` of a
    source checkout (what the test suite runs against), else the package's requirement."""
    from packaging.requirements import InvalidRequirement, Requirement

    lines: list[str] = []
    with contextlib.suppress(md.PackageNotFoundError):
        lines += md.requires("trl-rapidfire") or []
    root = checkout or Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "constraints.txt").is_file():
        lines += (root / "constraints.txt").read_text(encoding="utf-8").splitlines()
    tested: dict[str, str] = {}
    for line in lines:  # the pins come last: they override the ranges
        with contextlib.suppress(InvalidRequirement):  # blank and comment lines
            req = Requirement(line.split("#")[0].strip())
            if req.marker is None and str(req.specifier):
                tested[req.name.lower().replace("_", "-")] = str(req.specifier)
    return tested


def version_problem(installed: str, tested: str) -> str | None:
    """Why ``installed`` is outside ``tested`` (``==1.16.0``, ``>=2.6``), or ``None``
    (``2.13.0+cpu`` is ``==2.13.0``: a local build tag is not another version)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = Version(installed) in SpecifierSet(tested, prereleases=True)
    except InvalidVersion:
        return f"cannot be compared with the tested {tested}"
    return None if ok else f"not the tested version ({tested})"


def check_stack(tested: dict[str, str] | None = None) -> list[Finding]:
    """Python and the stack's packages against the versions they are tested with."""
    tested = tested_versions() if tested is None else tested
    try:
        own, py_spec = md.version("trl-rapidfire"), md.metadata("trl-rapidfire")["Requires-Python"]
    except md.PackageNotFoundError:
        own, py_spec = "not installed (imported from its source folder)", None
    found = [Finding("stack", "trl-rapidfire", own)]
    for dist in ("python", *STACK):
        spec = py_spec if dist == "python" else tested.get(dist)
        try:
            have = "{}.{}.{}".format(*sys.version_info) if dist == "python" else md.version(dist)
            bad = version_problem(have, spec) if spec else None
        except md.PackageNotFoundError:
            have, bad = "not installed", "missing"
        found.append(_flag("stack", dist, f"{have} (tested {spec})" if spec else have, bad,
                           bad or "", f"use a Python {spec} virtual environment"
                           if dist == "python" else f"pip install '{dist}{spec or ''}'"))
    return found


def trl_trainers(init_text: str) -> list[str]:
    """The trainer kinds TRL exports (``KTO`` for ``KTOTrainer``), read from the text of its
    ``__init__.py``'s lazy import table (``"trainer": [...]``): importing TRL takes seconds and
    the doctor must answer when it is broken."""
    table = re.search(r'"trainer":\s*\[(.*?)\]', init_text, re.S)
    names = re.findall(r'"(\w+)Trainer"', table.group(1)) if table else []
    return sorted(set(names))


def check_trainers(init: Path | None = None) -> list[Finding]:
    """Each trainer TRL exports against the RF pairs this package has."""
    from .. import TRAINER_KINDS

    if init is None:
        try:
            init = Path(str(md.distribution("trl").locate_file("trl/__init__.py")))
        except md.PackageNotFoundError:
            return []  # check_stack says TRL is missing
    try:
        exported = trl_trainers(_read_head(init, 1 << 20).decode("utf-8", "replace"))
    except (OSError, ValueError) as err:
        return [Finding("trainers", "TRL's trainers", f"unreadable ({err})")]
    ours = [k for k in TRAINER_KINDS if k in exported] if exported else list(TRAINER_KINDS)
    found = [Finding("trainers", "RF pairs", " ".join(f"RF{k}Trainer" for k in ours))]
    missing = [k for k in exported if k not in TRAINER_KINDS]
    if missing:
        found.append(Finding(
            "trainers", "without RF pair", " ".join(f"{k}Trainer" for k in missing),
            "this TRL exports trainers trl-rapidfire does not wrap yet",
            "train those with plain TRL, or use the tested trl version (see stack)"))
    return found


def probe_devices(python: str = sys.executable, timeout: float = PROBE_TIMEOUT) -> Devices:
    """What torch sees, asked of a fresh interpreter: a hung CUDA setup costs ``timeout``."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                              timeout=timeout)
    except (subprocess.TimeoutExpired, OSError) as err:
        return Devices(error=f"importing torch took over {timeout:.0f} s" if isinstance(
            err, subprocess.TimeoutExpired) else f"cannot start {python} ({err})")
    last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    if proc.returncode != 0:
        return Devices(error="torch is not installed" if "No module named 'torch'" in last
                       else f"importing torch failed: {last}")
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        return Devices(bool(data["cuda"]), tuple((str(n), int(m)) for n, m in data["gpus"]))
    except (IndexError, KeyError, TypeError, ValueError):
        return Devices(error=f"unreadable answer from the torch probe: {proc.stdout[-200:]!r}")


def check_devices(dev: Devices) -> list[Finding]:
    cpus = [Finding("devices", "CPUs", str(os.cpu_count()))]
    if dev.error:
        return [Finding("devices", "CUDA", "unknown", dev.error, "see why: python -c 'import "
                        "torch'; install it: pip install torch (bash scripts/install.sh)"), *cpus]
    if dev.cuda:
        return [Finding("devices", "CUDA", f"available, {len(dev.gpus)} GPU(s)"),
                *(Finding("devices", f"gpu {i}", f"{name}, {memory / GIB:.1f} GiB")
                  for i, (name, memory) in enumerate(dev.gpus)), *cpus]
    gpu_here = shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists()
    return [Finding("devices", "CUDA", "not available, 0 GPUs",
                    "this machine has an NVIDIA GPU that torch cannot use" if gpu_here else None,
                    "install a CUDA build of torch; check the driver: nvidia-smi" if gpu_here
                    else "runs train on the CPU: use_cpu=True, bf16=False in the config"), *cpus]


def accelerate_config_path(env: dict[str, str] | None = None) -> Path:
    """Where ``accelerate launch`` without ``--config_file`` reads its defaults, by accelerate's
    rule (1.15, commands/config/config_args.py): HF_HOME, else XDG_CACHE_HOME/huggingface."""
    env = dict(os.environ) if env is None else env
    home = env.get("HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(home), "accelerate", "default_config.yaml")


def check_accelerate(path: Path, dev: Devices) -> list[Finding]:
    """How many workers ``accelerate launch my_experiment.py`` starts; the trap: without CUDA,
    ``--num_processes N`` alone (or with ``--cpu``, or a NO or MULTI_CPU config) starts ONE."""
    import yaml

    gpus = len(dev.gpus) if dev.cuda else 0
    try:
        mode: int | None = os.stat(path).st_mode
    except OSError:  # missing, or a folder above it cannot be read: accelerate reads none either
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # accelerate's os.path.isfile skips it
        return [Finding("accelerate", "config", str(path), f"{_kind(mode)}, not a file: "
                        "accelerate launch skips it and reads no config", "remove it, or write a "
                        "config there: accelerate config")]
    exists = mode is not None
    config: Any = {"distributed_type": "MULTI_GPU" if gpus > 1 else "NO",  # no config: one
                   "num_processes": max(gpus, 1)}  # worker per GPU, torchrun from 2 GPUs on
    try:
        if exists:
            if len(raw_bytes := _read_head(path, MAX_CONFIG_BYTES)) > MAX_CONFIG_BYTES:
                size = os.stat(path).st_size  # checked before YAML reads it
                raise ValueError(f"{size // 1024} KiB, over the {MAX_CONFIG_BYTES // 1024} KiB "
                                 "an accelerate config can be: not read")
            text = raw_bytes.decode("utf-8")
            _yaml_depth(text)
            config = yaml.safe_load(text)
        if not isinstance(config, dict):
            raise ValueError(f"a YAML {type(config).__name__}, not the mapping accelerate reads")
        raw = config.get("distributed_type", "")
        # YAML reads an unquoted NO as false. Anything but text is refused before str() could
        # spell out a nested value (an alias bomb is small to read, huge to print).
        if raw is False:
            raw = "NO"
        if not isinstance(raw, str):
            raise ValueError(f"distributed_type is a YAML {type(raw).__name__}, not text")
        dist = raw.upper()
        mpirun = config.get("mpirun_config") or {}
        if not isinstance(mpirun, dict):
            raise ValueError(f"mpirun_config is a YAML {type(mpirun).__name__}, not a mapping")
        asked: Any = config.get("num_processes", 1 if dist == "NO" else None)
        machines: Any = config.get("num_machines") or 1
        if not dist or not all(_count(n).isdigit() and n >= 1 for n in (asked, machines)):
            raise ValueError(f"distributed_type {dist or '-'}, num_processes {_count(asked)}, "
                             f"num_machines {_count(machines)}: accelerate launch cannot use "
                             "these")
    except (OSError, ValueError, yaml.YAMLError) as err:  # UnicodeDecodeError is a ValueError
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        said = getattr(err, "problem", None) or " ".join(str(err).split())  # one line
        why = f"not valid YAML{where}: {said}" if isinstance(err, yaml.YAMLError) else str(err)
        return [Finding("accelerate", "config", str(path), why, "fix or remove it, or write a "
                        "new one: accelerate config")]
    many = dist in _MANY or (dist == "MULTI_CPU" and bool(mpirun.get("mpirun_hostfile")))
    workers = max(asked // machines, 1) if many else 1
    problem: str | None = None
    if workers > MAX_WORKERS_PER_MACHINE or machines > MAX_MACHINES:
        problem = (f"num_processes {asked} over num_machines {machines}: more than "
                   f"{MAX_WORKERS_PER_MACHINE} workers per machine or {MAX_MACHINES:,} machines "
                   "is not a count any machine or cluster has")
        fix = ("set num_processes to the number of GPUs of all machines (and num_machines to "
               "the machines): accelerate config")
    elif asked > 1 and not many:
        problem = (f"num_processes: {asked} with distributed_type: {dist}: accelerate launch "
                   "uses its simple launcher, which starts ONE worker")
        fix = (f"accelerate launch --multi_gpu --num_processes {asked} (or distributed_type: "
               "MULTI_GPU in the config)" if gpus else "on CPU: " + _CPU_LAUNCH.format(n=asked))
    elif gpus and workers != gpus:  # each worker trains on a GPU of its own
        problem = f"{workers} worker(s) for {gpus} GPU(s) on this machine"
        fix = f"accelerate launch --multi_gpu --num_processes {gpus * machines}"
    else:
        fix = "" if gpus else ("without CUDA, `accelerate launch --num_processes N` alone starts"
                               " ONE worker; N workers: " + _CPU_LAUNCH.format(n="N"))
    return [Finding("accelerate", "config", str(path) if exists else f"none (looked for {path})"),
            Finding("accelerate", "workers", f"{workers} per machine ({dist}, num_processes "
                    f"{asked})" if exists else f"{workers} (no config: one per GPU)", problem,
                    fix or None)]


def check_disk(output_dir: Path, shm: Path = Path("/dev/shm")) -> list[Finding]:
    """Free space where checkpoints go, and in /dev/shm (DataLoader workers and NCCL use it);
    an ``--output-dir`` that cannot be resolved (a loop of symbolic links) is a finding."""
    try:
        where = output_dir.resolve()
    except (OSError, RuntimeError) as err:  # Python < 3.13 says RuntimeError for a loop
        loop = isinstance(err, RuntimeError) or getattr(err, "errno", None) == errno.ELOOP
        return [Finding("disk", "output_dir", str(output_dir), "a loop of symbolic links"
                        if loop else f"cannot be resolved ({err})", "point --output-dir (the "
                        "script's output_dir) at a folder that is not a link loop")]
    while not where.exists() and where != where.parent:
        where = where.parent
    found = []
    for label, place, least, risk, fix in (
            ("free disk", where, MIN_FREE_DISK, "many runs' checkpoints fill it", "free space, "
             "or put output_dir on a bigger disk (check: trl-rapidfire doctor --output-dir DIR)"),
            ("/dev/shm", shm, MIN_FREE_SHM, "DataLoader workers die of a bus error", "in "
             "Docker: docker run --shm-size=8g (or --ipc=host); else dataloader_num_workers=0")):
        free = shutil.disk_usage(place).free if place.is_dir() else None
        found.append(Finding("disk", label, "absent") if free is None else _flag(
            "disk", label, f"{free / GIB:.1f} GiB free in {place}", free < least,
            f"under {least // GIB} GiB: {risk}", fix))
    return found


def render(findings: list[Finding], width: int = 100) -> str:
    """One screen: a section per check, ``!!`` marking a problem, its fix under it."""
    problems = sum(f.problem is not None for f in findings)
    lines = [f"trl-rapidfire doctor: {problems or 'no'} problem{'s' * (problems != 1)}"]
    pad = max((len(f.label) for f in findings), default=0) + 5
    for i, f in enumerate(findings):
        # Every field may carry outside text (the YAML, the URI, a path): escaped here, once.
        f = Finding(f.section, printable(f.label), printable(f.value),
                    None if f.problem is None else printable(f.problem),
                    None if f.fix is None else printable(f.fix))
        if i == 0 or f.section != findings[i - 1].section:
            lines.append(f"\n{f.section}")
        lines += textwrap.wrap(f"{'!!' if f.problem else '  '} {f.label:<{pad - 5}}  {f.value}"
                               + (f": {f.problem}" if f.problem else ""), width,
                               subsequent_indent=" " * pad, break_on_hyphens=False)
        lines += textwrap.wrap(f"{'fix' if f.problem else 'note'}: {f.fix}", width,
                               initial_indent=" " * pad, subsequent_indent=" " * (pad + 2),
                               break_on_hyphens=False, break_long_words=False) if f.fix else []
    return "\n".join(lines)


def main(args: Any = None) -> int:
    """Print the screen for ``args.output_dir`` (default: here); 0 if no problem, else 1."""
    from ..tracking.tags import resolve_tracking_uri

    findings = [*check_stack(), *check_trainers(), *check_devices(devices := probe_devices()),
                *check_accelerate(accelerate_config_path(), devices),
                *check_disk(Path(getattr(args, "output_dir", None) or ".")),
                *check_tracking(resolve_tracking_uri())]
    print(render(findings))
    return 1 if any(f.problem for f in findings) else 0
