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
process sees a world of one; on CUDA it pins the process to its own GPU. The record lives in
the environment (not a module global) so it survives re-imports and is what child processes
would see too.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "LEASE_VARIABLE",
    "WorkerInfo",
    "current_worker",
    "lease_seconds",
    "detach_from_launch",
    "in_launch_world",
    "launcher_gone",
    "process_alive",
]

_RECORD = "TRL_RAPIDFIRE_WORKER"
# How long a worker's claim on a chunk lives without renewal: how soon the runs of a worker on
# another machine that died go back into the rotation (on the same machine a dead worker's
# pid tells at once).
LEASE_VARIABLE = "TRL_RAPIDFIRE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 120.0
_PARENT_RECORD = "TRL_RAPIDFIRE_LAUNCHER"  # "<this pid>:<the launcher's pid>"


@dataclass(frozen=True)
class WorkerInfo:
    """Who this worker is.

    Attributes:
        rank: its index among the launched processes (0 when not launched).
        local_rank: its index on this machine (its GPU).
        world_size: how many workers were launched (1 when not launched).
        token: unique to this process (a re-used pid is not the same worker).
        launch: identifies the launch (all its workers share it, on every machine; empty when
            not launched).
        machines: how many machines the launch spans (1 when not launched).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    token: str = ""
    launch: str = ""
    machines: int = 1

    @property
    def id(self) -> str:
        """``host:pid:token``: how the shared scheduler state names this worker."""
        return f"{socket.gethostname()}:{os.getpid()}:{self.token}"

    @property
    def launched(self) -> bool:
        return self.world_size > 1


def _from_record(text: str) -> WorkerInfo:
    rank, local_rank, world, pid, token, launch, machines = text.split(",")
    if int(pid) != os.getpid():  # inherited by a child process: not this worker's record
        raise ValueError
    return WorkerInfo(int(rank), int(local_rank), int(world), token, launch, int(machines))


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
    text = os.environ.get(_RECORD)
    if text:
        try:
            return _from_record(text)
        except ValueError:
            pass  # inherited from a parent process: this one records its own
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
        os.environ[_PARENT_RECORD] = f"{os.getpid()}:{os.getppid()}"
        from .accelerate_state import leave_launch_world  # accelerate, torch: seconds

        leave_launch_world(local_rank)
    os.environ[_RECORD] = (f"{rank},{local_rank},{world},{os.getpid()},{info.token},"
                           f"{info.launch},{info.machines}")
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
    record = os.environ.get(_PARENT_RECORD, "")
    pid, _, parent = record.partition(":")
    if not parent or pid != str(os.getpid()):
        return None
    return int(parent) if os.getppid() != int(parent) else None


def process_alive(worker_id: str) -> bool | None:
    """Whether the worker named ``worker_id`` (``host:pid:token``) is alive: ``None`` when it
    ran on another machine (only its lease can tell)."""
    try:
        host, pid, token = worker_id.rsplit(":", 2)
        pid_n = int(pid)
    except ValueError:
        return None
    if not 0 < pid_n < 1 << 22:  # read from the shared state: 0 or -1 would name a group
        return False
    if host != socket.gethostname():
        return None
    if pid_n == os.getpid():
        return token == current_worker().token
    try:
        os.kill(pid_n, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lease_seconds() -> float:
    """The claims' lease: ``TRL_RAPIDFIRE_LEASE_SECONDS`` if set (every machine of a launch
    should set the same), else 120 s. A worker renews its claim every quarter of it while it
    trains. Raises ``ValueError`` naming the variable for a value that is not a number of
    seconds of at least 2."""
    text = os.environ.get(LEASE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LEASE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 2.0 or value == float("inf"):
        raise ValueError(f"{LEASE_VARIABLE}={text!r}: give the claims' lease in seconds, a "
                         f"number of at least 2 (default {DEFAULT_LEASE_SECONDS:g}).")
    return value
