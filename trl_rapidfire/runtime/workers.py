"""This process's place among the experiment's workers, and leaving the launcher's world.

Under ``accelerate launch --num_processes N`` or ``torchrun``, every process runs the same
script. trl-rapidfire makes each one a *worker* that trains whole runs on its own device
(task parallelism): runs are not copied N ways. transformers would otherwise see the launch
(``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment) and wrap every trainer in DDP,
average gradients across workers and shard the data; GRPO would also size its generation
batch by the world size.

:func:`detach_from_launch` is called once per process, before the first ``TrainingArguments``
is built (from the RF config's ``__post_init__``): it records the launch in
``TRL_RAPIDFIRE_WORKER`` and removes the launcher's variables, so every trainer of this
process sees a world of one; on CUDA it pins the process to its own GPU. The record
(:mod:`trl_rapidfire.shared_state.worker_info`) lives in the environment (not a module global)
so it survives re-imports and is what child processes would see too.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator

from ..shared_state.worker_info import (
    PARENT_RECORD_VARIABLE,
    WorkerInfo,
    recorded_worker,
    write_record,
)

__all__ = ["current_worker", "detach_from_launch", "in_launch_world", "launcher_gone",
           "one_worker_warning"]

# The key under which the first worker publishes the launch's identity in the rendezvous
# store (one per restart of the worker group: a restart is a new launch).
_LAUNCH_KEY = "trl_rapidfire/launch/{restart}"


def _launch_identity(rank: int) -> str:
    """What every worker of this launch agrees on, on every machine, and no other launch has.

    Under torchrun (``accelerate launch`` included) the rendezvous store of the launch is a
    ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT`` that every worker can reach: the first worker
    publishes a fresh id there and the others read it. Without one (a launcher that sets only
    ``RANK``/``WORLD_SIZE``), the launcher's pid on this host, which only a single-machine
    launch shares."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        from datetime import timedelta

        from torch.distributed import TCPStore

        key = _LAUNCH_KEY.format(restart=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        try:
            # Workers reach this point at about the same time (building their first RF
            # config); the others wait for the first as long as torch's own rendezvous would.
            store = TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=600))
            if rank == 0:
                store.set(key, uuid.uuid4().hex)
            return f"{addr}:{port}:{store.get(key).decode()}"
        except (RuntimeError, OSError, ValueError):  # no store there after all
            pass
    return (f"{socket.gethostname()}:{os.getppid()}:"
            f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}")


def _machines(world: int) -> int:
    """How many machines the launch spans: torchrun's node count, else the world over the
    workers on this machine."""
    groups = os.environ.get("GROUP_WORLD_SIZE")
    if groups:
        return max(int(groups), 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    return max(world // max(local, 1), 1)


def current_worker() -> WorkerInfo:
    """This process's worker record (made by :func:`detach_from_launch` if it has not run)."""
    return detach_from_launch()


def detach_from_launch() -> WorkerInfo:
    """Record the launch this process belongs to and leave it: afterwards every trainer built
    here is a world of one. Idempotent: later calls return the record."""
    recorded = recorded_worker()
    if recorded is not None:
        return recorded
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rank = int(os.environ.get("RANK", "0") or 0)
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)) or 0)
    launch, machines = "", 1
    if world > 1:
        # Tells this launch from the next one on the same folder (a re-run after a crash).
        launch, machines = _launch_identity(rank), _machines(world)
    info = WorkerInfo(rank, local_rank, world, uuid.uuid4().hex[:8], launch.replace(",", ";"),
                      machines)
    if world > 1:
        os.environ[PARENT_RECORD_VARIABLE] = f"{os.getpid()}:{os.getppid()}"
        from .accelerate_state import leave_launch_world  # accelerate, torch: seconds

        leave_launch_world(local_rank)
    write_record(info)
    return info


@contextlib.contextmanager
def in_launch_world() -> Iterator[WorkerInfo]:
    """Re-enter the launcher's world for the body (see
    :func:`~trl_rapidfire.runtime.accelerate_state.launch_world`); a ``TrainingArguments`` built
    here
    sees all the launch's workers (a gang run, e.g. FSDP)."""
    info = current_worker()
    if not info.launched:
        raise RuntimeError("not launched: there is no launch world to enter")
    from .accelerate_state import launch_world

    with launch_world():
        yield info


def launcher_gone() -> int | None:
    """The pid of this worker's launcher if the launcher is gone (killed alone, its workers
    orphaned and adopted by init or a subreaper), else ``None`` (alive, or not launched)."""
    record = os.environ.get(PARENT_RECORD_VARIABLE, "")
    pid, _, parent = record.partition(":")
    if not parent or pid != str(os.getpid()):
        return None
    return int(parent) if os.getppid() != int(parent) else None


def _asked_processes(argv: list[str]) -> int | None:
    """``--num_processes N`` of an ``accelerate launch`` command line (its own options: those
    before the script), or ``None`` when ``argv`` is not one."""
    # `accelerate launch ...` (its console script, run by a Python) or `python -m
    # accelerate.commands.launch ...`.
    words = [os.path.basename(a) for a in argv[:4]]
    if "accelerate.commands.launch" in words:
        start = words.index("accelerate.commands.launch") + 1
    elif "launch" in words and any(w.startswith("accelerate") for w in words):
        start = words.index("launch") + 1
    else:
        return None
    options = argv[start:]
    for i, arg in enumerate(options):
        if arg.endswith(".py") or arg in ("-m", "--module"):
            break  # the script (or module) and its own arguments follow
        name, _, value = arg.partition("=")
        if name in ("--num_processes", "--num-processes"):
            value = value or (options[i + 1] if i + 1 < len(options) else "")
            return int(value) if value.isdigit() else None
    return None


def one_worker_warning() -> str | None:
    """What to tell a person whose ``accelerate launch --num_processes N`` started this one
    process only: without ``--multi_gpu`` (or a config saying so), accelerate's simple launcher
    runs the script once, on a machine with fewer than two GPUs silently. ``None`` when this
    process is a worker of a launch, or was not started by ``accelerate launch`` (Linux: the
    parent's command line; elsewhere nothing is known)."""
    if current_worker().launched:
        return None
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            argv = f.read(64 * 1024).decode(errors="replace").split("\0")
    except OSError:
        return None
    asked = _asked_processes([a for a in argv if a])
    if asked is None or asked < 2:
        return None
    return (f"accelerate launch asked for {asked} processes, but it started this one only, so "
            "the experiment trains with ONE worker: without --multi_gpu (or an accelerate "
            "config saying so) accelerate runs the script once. Add --multi_gpu "
            f"(`accelerate launch --multi_gpu --num_processes {asked} ...`): it starts "
            f"{asked} workers, over gloo on a machine without GPUs. `trl-rapidfire doctor` "
            "shows what a launch would get.")
