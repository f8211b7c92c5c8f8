"""A gang (an FSDP run trained by every worker of a launch at once) in the shared state:
whether it has all its members, disbanding one still forming when its run leaves the
rotation, and its chunk recorded once the last member has finished its share. Claiming a
gang's chunk is :func:`~trl_rapidfire.shared_state.store.claim_next`'s (one claim rule for
every run); split from :mod:`.store` along this seam."""

from __future__ import annotations

from .store import ExperimentState, finish_chunk

__all__ = ["disband_forming_gang", "finish_gang_chunk", "gang_ready"]


def gang_ready(state: ExperimentState) -> bool | None:
    """Whether the gang has all its members (``None``: no gang any more, e.g. it broke up
    because a member died)."""
    gang = state.gang
    if gang is None:
        return None
    return len(gang["members"]) >= state.gang_size[gang["run"]]


def disband_forming_gang(state: ExperimentState, run: str) -> bool:
    """``run`` left the rotation (stopped, deleted, failed): a gang still forming for it is
    disbanded, its claim released, so its next chunk is not trained after all. A gang whose
    members have all joined is training and finishes its chunk. Returns whether one was."""
    gang = state.gang
    if gang is None or gang["run"] != run or gang_ready(state):
        return False
    state.gang = None
    state.claims.pop(run, None)
    return True


def finish_gang_chunk(state: ExperimentState, run: str, worker: str, chunk: int, *,
                      global_step: int | None = None, complete: bool = False) -> bool | None:
    """A gang member finished ``chunk`` of ``run`` (its share of the checkpoint is written).

    The last member to finish records the chunk, as :func:`finish_chunk` does, and ends the
    gang. Returns ``True`` for that member, ``None`` for the others, ``False`` if the gang is
    gone (a member died and the chunk is trained again).
    """
    gang = state.gang
    if gang is None or gang["run"] != run or gang["chunk"] != chunk \
            or worker not in gang["members"]:
        return False
    if worker not in gang["done"]:
        gang["done"].append(worker)
    if len(gang["done"]) < len(gang["members"]):
        return None
    claim = state.claims.get(run)
    state.gang = None
    if claim is None:
        return False
    return finish_chunk(state, run, claim.worker, chunk, global_step=global_step,
                        complete=complete)
