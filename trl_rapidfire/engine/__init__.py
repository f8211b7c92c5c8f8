"""The chunk engine: trains many runs in one process, one chunk at a time, each exactly as if
it were trained alone.

Each run is a live Trainer whose ``train()`` runs in a coroutine of its own (see
:mod:`trl_rapidfire.runtime.switch`). The engine's loop repeats:

1. ask the scheduler (:func:`~trl_rapidfire.shared_state.scheduler.pick_next`) which run goes
   next;
2. *switch in*: park the previous run's tensors in the state cache and unpark this run's
   (:mod:`trl_rapidfire.runtime.residency`), activate its adapter, give it back its RNG
   streams and accelerate state;
3. resume its coroutine; its :class:`ChunkCallback` suspends it at the next chunk boundary
   (or the run ends, or fails);
4. *switch out*: save its RNG streams and accelerate state, record the chunk in the schedule.

Which run goes next is claimed from the experiment's shared state
(:mod:`trl_rapidfire.shared_state.store`), so the same loop is one worker among several under
``accelerate launch``: each (run, chunk) is claimed by exactly one worker. At chunk boundaries
(as often as ``checkpoint_every`` says) the run writes an ordinary HF checkpoint
(:mod:`trl_rapidfire.storage.checkpoints`). A run whose last chunk this worker trained
continues in its suspended ``train()`` (the fast path); any other run, one trained by another
worker or before a crash, is rebuilt and continues with the Trainer's own
``train(resume_from_checkpoint=...)``.

The engine knows nothing of SFT, DPO or GRPO: it drives a run's trainer through the
:class:`~.run_trainer.RunTrainer` protocol only; the trainer layer builds each run
(:class:`~.run_trainer.NewRun`) and registers it with the engine's
:class:`~.building.RunRegistry` (or registers it planned, :class:`~.run_trainer.PlannedRun`,
to be built at its first turn), and the engine asks the :class:`~.run_trainer.RunFactory` it
was constructed with for rebuilds, planned runs and clones.

May import: ``reports``, ``control``, ``tracking``, ``config``'s vocabulary (knobs, fields),
``shared_state``, ``runtime``, ``storage``; never ``trainers``, ``integrations``, ``client``,
``search`` or the RF config classes (import-linter contracts in pyproject.toml).

The package, one concept a module (lower ones never import higher ones)::

    chunks.py        the chunk plan: where each run's epochs are cut
    run_trainer.py   the seam: RunTrainer (what the engine asks of a run's trainer),
                     NewRun (a built run), PlannedRun (one built at its first turn),
                     RunFactory (rebuilds, planned runs, clones), EvalCadence
    records.py       RunSlot (what a run is, plus one record per owner: TurnState,
                     Durability, WarmStart, Outcome), WeightsAt, a pending chunk's Recording,
                     EngineStats, LoopHooks
    faults.py        disk faults met by our writes, the one that stops the experiment
    lifetime.py      the wall clock, the claim's lease while a chunk trains, Ctrl-C, orphans
    callback.py      ChunkCallback, and TurnHost: the little it asks of the engine
    building.py      a built trainer -> its chunk plan and RunSlot; runs failed before
                     training; RunRegistry: runs registered built, or planned and built later
    divergence.py    a run whose loss or weights stop being finite fails
    turns.py         switch in/out, parking, continuing from disk, boundary and final writes
    claims.py        what a claim answers: Turn | Wait | Retry | Done, GangWait
    catch_up.py      a run that went on elsewhere: its weights and trainer state on disk
    coordination.py  the shared state: register, claim, gangs, recording finished chunks
    durability.py    writing the volatile boundaries of runs stopped or leaving this worker
    reporting.py     the tracker: chunk reports, the end of a run() call, ops from tags
    clones.py        clones: built by the factory, registered, warm-started; from recipes
    proposals.py     runs an adaptive search proposes while the experiment trains
    policy_view.py   the policy's one Context, kept up to date with the runs that moved
    ops.py           the ops desk: queue, policy, apply
    core.py          Engine: the face the trainer layer sees, and the loop of run()
"""

from .callback import ChunkCallback, TurnHost
from .coordination import Claim, Done, Retry, Turn, Wait
from .core import Engine
from .records import EngineStats, RunFailure, RunSlot, WeightsAt
from .run_trainer import EvalCadence, NewRun, PlannedRun, RunFactory, RunTrainer

__all__ = [
    "ChunkCallback",
    "Claim",
    "Done",
    "Engine",
    "EngineStats",
    "EvalCadence",
    "NewRun",
    "PlannedRun",
    "Retry",
    "RunFactory",
    "RunFailure",
    "RunSlot",
    "RunTrainer",
    "Turn",
    "TurnHost",
    "Wait",
    "WeightsAt",
]
