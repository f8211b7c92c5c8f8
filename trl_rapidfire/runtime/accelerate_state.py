"""The wall around process-global state: accelerate's singletons and the launch's world, for
every trainer in the process and for every experiment after another in it.

Nothing else in the package saves, clears or rebuilds accelerate's state, or touches the
launcher's environment variables (:mod:`trl_rapidfire.runtime.workers` says who this worker is, and
calls in here to leave and re-enter the launch). Every run's trainer (at setup, rebuilt on
another worker, a clone, a gang run, the user's next experiment) is built inside
:func:`building_in`.

accelerate keeps its state in three process-wide singletons (``PartialState``,
``AcceleratorState``, ``GradientState``). Two things overwrite them behind a live trainer's back:

* every ``TrainingArguments.__post_init__`` reads ``self.device``, which clears
  ``AcceleratorState`` (re-creating only ``PartialState``); a trainer built earlier then fails at
  ``train()`` with ``'AcceleratorState' object has no attribute 'distributed_type'``. Building a
  config alone goes through :func:`preserved_accelerate_state`;
* every trainer builds an ``Accelerator``, which writes its own settings (gradient accumulation
  steps, dataloader references) into ``GradientState``. Runs that take turns in one process
  each keep a :func:`snapshot_accelerate_state` and get it back with
  :func:`restore_accelerate_state` before their next turn.

And one thing an experiment must not leave behind: ``AcceleratorState`` keeps the mixed
precision of the first ``Accelerator`` built after it was cleared, and refuses another one
("AcceleratorState has already been initialized"). A plain TRL script never meets this, because
every config clears the state just before its trainer is built; here configs are built long
before their trainers, so every run's trainer is built right after :func:`fresh_accelerator_state`,
and an experiment's setup and its ``train()`` calls run :func:`left_as_found`, so the next
experiment (or a plain TRL trainer) in the process finds the state as the script had it.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import os
from collections.abc import Iterator
from typing import Any

from accelerate.state import AcceleratorState, GradientState, PartialState

__all__ = [
    "World",
    "answer_package_checks_once",
    "building_in",
    "enter_world_of_one",
    "fill_empty_from",
    "fresh_accelerator_state",
    "fsdp_on_cpu_installed",
    "FSDP_ON_CPU_MARK",
    "launch_partial_state",
    "launch_world",
    "leave_launch_world",
    "left_as_found",
    "preserved_accelerate_state",
    "reset_for_launch_world",
    "restore_accelerate_state",
    "snapshot_accelerate_state",
    "without_barriers",
]

_STATES = (PartialState, AcceleratorState, GradientState)

AccelerateSnapshot = list[dict[str, Any]]


def answer_package_checks_once() -> None:
    """Keep accelerate's answers to "is package X installed?" for the process.

    accelerate asks ``importlib.metadata`` (a package's METADATA file, parsed) every time it
    checks for PEFT, DeepSpeed and the like: each ``Trainer`` built checks about 16 times (in
    ``is_peft_model``, ``unwrap_model``), ~9 ms a run's trainer on this stack, a third of
    building one when many configs share a base model. What is installed does not change while
    the process trains, so the first answer is kept (the same answers, once). A later
    accelerate without this private helper is left as it is.
    """
    from accelerate.utils import imports

    check = getattr(imports, "_is_package_available", None)
    if callable(check) and not hasattr(check, "cache_info"):
        imports._is_package_available = functools.cache(check)


def _copied(values: dict[str, Any]) -> dict[str, Any]:
    # GradientState keeps its dataloader references in a list and its plugin settings in a dict,
    # both changed in place: a snapshot needs its own containers, not just its own dict. (Two
    # passes, no call per value: this runs twice a turn.)
    out = dict(values)
    for key, value in values.items():
        if isinstance(value, (list, dict)):
            out[key] = value.copy()
    return out


def snapshot_accelerate_state() -> AccelerateSnapshot:
    """A copy of accelerate's shared state as it is now."""
    return [_copied(cls._shared_state) for cls in _STATES]


def restore_accelerate_state(snapshot: AccelerateSnapshot, *, keep_empty: bool = False) -> None:
    """Put back a :func:`snapshot_accelerate_state`.

    With ``keep_empty``, a singleton that was not initialised in the snapshot keeps whatever it
    holds now instead of being cleared.
    """
    for cls, saved in zip(_STATES, snapshot):
        if keep_empty and not saved:
            continue
        cls._shared_state.clear()
        cls._shared_state.update(_copied(saved))


@contextlib.contextmanager
def preserved_accelerate_state() -> Iterator[None]:
    """Run the body, then put back accelerate's shared state if it was set before.

    When nothing was initialised before (no trainer exists yet), whatever the body set up is
    kept: that is what building a plain TRL config does, and the next trainer re-initialises it.
    """
    saved = snapshot_accelerate_state()
    try:
        yield
    finally:
        restore_accelerate_state(saved, keep_empty=True)


def fill_empty_from(snapshot: AccelerateSnapshot) -> None:
    """Give each of accelerate's singletons that is empty now its value in ``snapshot``; one
    that holds a state keeps it (it is the script's)."""
    for cls, saved in zip(_STATES, snapshot):
        if not cls._shared_state and saved:
            cls._shared_state.update(_copied(saved))


@contextlib.contextmanager
def left_as_found() -> Iterator[None]:
    """Run the body, then put accelerate's state back exactly as it was (cleared, if it was):
    an experiment's setup and its training leave the process as the script had it."""
    saved = snapshot_accelerate_state()
    try:
        yield
    finally:
        restore_accelerate_state(saved)


def fresh_accelerator_state() -> None:
    """Clear ``AcceleratorState`` (the process's ``PartialState`` stays), as a TRL config's
    ``__post_init__`` leaves it right before a plain script builds that config's trainer: the
    trainer's ``Accelerator`` then takes its own settings, whatever was built before it."""
    AcceleratorState._reset_state(reset_partial_state=False)


def reset_for_launch_world() -> None:
    """Clear all of accelerate's process state, so the next ``TrainingArguments`` or
    ``Accelerator`` sets it up from the launch's environment (a gang run's world)."""
    AcceleratorState._reset_state(reset_partial_state=True)


def enter_world_of_one() -> None:
    """Make accelerate's state a world of one again if it is the launch's (a gang run's turn
    left it so), so that a single-device run's trainer built now is neither wrapped in DDP nor
    given the gang's FSDP plugin. A state that is already a world of one is kept."""
    distributed = bool(PartialState._shared_state) and PartialState().num_processes > 1
    if distributed or AcceleratorState._shared_state.get("fsdp_plugin") is not None:
        AcceleratorState._reset_state(reset_partial_state=True)


def launch_partial_state(config: Any) -> None:
    """accelerate's process state for the launch's world, as ``config`` set it up when it was
    built there (a gang run's trainer reads it through ``config.distributed_state``)."""
    from datetime import timedelta

    PartialState(cpu=config.use_cpu, backend=config.ddp_backend,
                 timeout=timedelta(seconds=config.ddp_timeout))


@contextlib.contextmanager
def without_barriers() -> Iterator[None]:
    """Build a gang run's trainer without the launch-wide barriers TRL puts around dataset
    preparation (``main_process_first``: the main process fills the datasets cache first).

    Each member builds a clone's trainer when it learns of the clone, and rebuilds a run's
    trainer when it claims the run, at its own time: a barrier there waits for a member that
    is training something else, or holds the shared state's lock, and never comes (a
    deadlock, seen with two workers). Without it every member prepares the data itself, which
    at worst repeats work the cache would have saved; the gang's collectives start only in
    ``train()``, after the members have met."""
    original = PartialState.wait_for_everyone
    PartialState.wait_for_everyone = lambda self: None
    try:
        yield
    finally:
        PartialState.wait_for_everyone = original


# ----------------------------------------------------------------------------- the launch's world

_LAUNCH_RECORD = "TRL_RAPIDFIRE_LAUNCH_ENV"  # the launcher's variables, as JSON
# What torchrun / accelerate launch set for a distributed process; transformers and accelerate
# decide on DDP from them.
_LAUNCH_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)  # fmt: skip


def leave_launch_world(local_rank: int) -> None:
    """Keep the launcher's variables aside (for :func:`launch_world`) and remove them, pin the
    process to its own GPU, and make accelerate's state a world of one: every trainer built
    afterwards trains on this worker alone."""
    launch_env = {n: os.environ[n] for n in _LAUNCH_VARS if n in os.environ}
    os.environ[_LAUNCH_RECORD] = json.dumps({"pid": os.getpid(), "env": launch_env})
    for name in _LAUNCH_VARS:
        os.environ.pop(name, None)
    _pin_device(local_rank)
    # A script that built an Accelerator before its RF config already holds a distributed
    # PartialState; trainers built from it would still use DDP.
    enter_world_of_one()


@contextlib.contextmanager
def launch_world() -> Iterator[None]:
    """Re-enter the launcher's world for the body: its variables are back in the environment
    and accelerate's state is cleared, so a ``TrainingArguments``/``Accelerator`` built here
    sees all the launch's workers. Afterwards the environment is as it was; accelerate's
    state is the caller's to restore (see :func:`left_as_found`)."""
    record = json.loads(os.environ.get(_LAUNCH_RECORD, "{}"))
    if record.get("pid") != os.getpid():
        raise RuntimeError("not launched: there is no launch world to enter")
    # Exactly what the launcher gave this process (torchrun's workers, e.g., must connect to
    # its agent's rendezvous store rather than open one: TORCHELASTIC_USE_AGENT_STORE).
    saved = {name: os.environ.get(name) for name in _LAUNCH_VARS}
    os.environ.update(dict(record["env"]))
    reset_for_launch_world()
    try:
        yield
    finally:
        # accelerate writes some of these itself (on CPU): put every one back as it was.
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _pin_device(local_rank: int) -> None:
    # Each worker owns one GPU. Before CUDA is initialised, narrowing CUDA_VISIBLE_DEVICES makes
    # "cuda" mean that GPU for everything in the process; afterwards only set_device can.
    import torch

    if not torch.cuda.is_available():
        return
    if not torch.cuda.is_initialized():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = (visible.split(",") if visible
                   else [str(i) for i in range(torch.cuda.device_count())])
        if local_rank < len(devices):
            os.environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank]
            return
    torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))


class World(enum.Enum):
    """Where a run's trainer is built: this worker alone, or the whole launch (a gang run)."""

    ONE = "one"
    LAUNCH = "launch"


@contextlib.contextmanager
def building_in(world: World, config: Any = None) -> Iterator[None]:
    """Build a run's ``TrainingArguments`` or trainer in the body, in ``world``.

    ``World.ONE``: a world of one (a gang run's turn may have left the launch's), with
    ``AcceleratorState`` cleared as a TRL config leaves it right before a plain script builds
    its trainer, so the trainer's ``Accelerator`` takes this run's settings (its mixed
    precision) whatever was built before.

    ``World.LAUNCH``: the launch's world (every worker must get here, in the same order: the
    first time, it joins the launch's process group). With ``config`` (a gang run's trainer
    is built), accelerate's process state is set up from it, and TRL's launch-wide barriers
    are off (see :func:`without_barriers`). The environment is put back afterwards;
    accelerate's state is left as the build made it, for the caller to snapshot.
    """
    if world is World.ONE:
        enter_world_of_one()
        fresh_accelerator_state()
        yield
        return
    with launch_world():
        if config is None:
            yield
            return
        launch_partial_state(config)
        with without_barriers():
            yield


# ----------------------------------------------------------------------------- FSDP on CPU (tests)

# The mark :func:`trl_rapidfire.testing.fsdp_on_cpu` leaves on the AcceleratorState constructor
# it wraps: the FSDP checks read it to let a CPU launch shard (tests only).
FSDP_ON_CPU_MARK = "rf_fsdp_on_cpu"


def fsdp_on_cpu_installed() -> bool:
    """Whether :func:`trl_rapidfire.testing.fsdp_on_cpu` ran in this process."""
    return bool(getattr(AcceleratorState.__init__, FSDP_ON_CPU_MARK, False))
