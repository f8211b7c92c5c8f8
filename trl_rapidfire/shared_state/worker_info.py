"""Workers as the shared state knows them: who a worker is (its id in claims), whether the
worker named in a claim is still alive, and how long a claim lives without renewal.

A worker's record (:class:`WorkerInfo`) is written into this process's environment when it
leaves the launch (:mod:`trl_rapidfire.runtime.workers`, which needs torch for the launch's
rendezvous). What is here reads records and processes only: the shared state and the command
line ask whether a claim's worker still lives without loading torch.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "LEASE_VARIABLE",
    "WorkerInfo",
    "lease_seconds",
    "process_alive",
    "recorded_worker",
    "write_record",
]

RECORD_VARIABLE = "TRL_RAPIDFIRE_WORKER"
# How long a worker's claim on a chunk lives without renewal: how soon the runs of a worker on
# another machine that died go back into the rotation (on the same machine a dead worker's
# pid tells at once).
LEASE_VARIABLE = "TRL_RAPIDFIRE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 120.0
PARENT_RECORD_VARIABLE = "TRL_RAPIDFIRE_LAUNCHER"  # "<this pid>:<the launcher's pid>"


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


def recorded_worker() -> WorkerInfo | None:
    """This process's worker record, if it has left the launch (or was never launched) and
    recorded itself; ``None`` before that, or when the record was inherited from a parent."""
    text = os.environ.get(RECORD_VARIABLE)
    if not text:
        return None
    try:
        rank, local_rank, world, pid, token, launch, machines = text.split(",")
        if int(pid) != os.getpid():  # inherited by a child process: not this worker's record
            return None
        return WorkerInfo(int(rank), int(local_rank), int(world), token, launch, int(machines))
    except ValueError:
        return None


def write_record(info: WorkerInfo) -> None:
    """Record ``info`` as this process's worker (in the environment, so that re-imports of
    this package find it)."""
    os.environ[RECORD_VARIABLE] = (f"{info.rank},{info.local_rank},{info.world_size},"
                                   f"{os.getpid()},{info.token},{info.launch},{info.machines}")


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
        # Only this process's own record can say (a re-used pid is another worker).
        me = recorded_worker()
        return me is not None and token == me.token
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
