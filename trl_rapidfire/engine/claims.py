"""What a worker's claim on the shared state answers (:class:`Turn`, :class:`Wait`,
:class:`Retry`, :class:`Done`), and how waiting for a gang ends (:class:`GangWait`)."""

from __future__ import annotations

import concurrent.futures
import enum
from dataclasses import dataclass, field

from .records import RunSlot

__all__ = ["Claim", "Done", "GangWait", "Retry", "Turn", "Wait", "ready_call"]


@dataclass(frozen=True, eq=False)
class _Claim:
    # The runs whose chunks the claim's transaction recorded: their turns end now.
    recorded: tuple[RunSlot, ...] = field(default=(), kw_only=True)
    # Runs this worker holds volatile that another, idle, worker could take: their state is
    # written now (see store.handoff).
    handoff: tuple[RunSlot, ...] = field(default=(), kw_only=True)


@dataclass(frozen=True, eq=False)
class Turn(_Claim):
    """This worker holds the claim of chunk number ``chunk`` of ``slot``: train it."""

    slot: RunSlot
    chunk: int


@dataclass(frozen=True, eq=False)
class Wait(_Claim):
    """Nothing to claim now, but runs may come back: other workers are training them, or
    this worker's own checkpoint writes are pending (their runs stay claimed until
    recorded)."""


@dataclass(frozen=True, eq=False)
class Retry(_Claim):
    """Claim again at once, after building ``clones`` (made by another worker: ``{name:
    recipe}``) or waiting for ``write`` (the checkpoint of the run to train next)."""

    clones: dict[str, dict[str, str]] = field(default_factory=dict)
    write: concurrent.futures.Future | None = None


@dataclass(frozen=True, eq=False)
class Done(_Claim):
    """No run is left for this worker."""


Claim = Turn | Wait | Retry | Done


class GangWait(enum.Enum):
    """How waiting for a gang's members ended."""

    READY = "ready"  # every member joined: train the chunk together
    BROKEN = "broken"  # a member is gone: the chunk will be trained again
    TIMED_OUT = "timed out"  # the gang did not form in time: the run failed


def ready_call(token: str, launch: str) -> int:
    """The ``run()`` call of the shared state's ready token (``<launch>#<call>``, set by a
    launch's first worker as each call starts); 0 for another launch's."""
    head, _, call = token.rpartition("#")
    return int(call) if head == launch and call.isdigit() else 0
