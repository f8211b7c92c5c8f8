"""What the trainer kinds that generate inside their training loop share (GRPO, RLOO, on-policy
Distillation): a generation cycle, chunk boundaries on whole cycles, a chunk plan read from a
built trainer's dataloader, and reward functions that keep state.

A cycle spans ``steps_per_generation x num_iterations`` micro-steps (GRPO, RLOO; Distillation
generates once per optimizer step): completions are generated once and consumed slice by slice.
Chunk boundaries are rounded to whole cycles (and whole gradient-accumulation groups), so a run
never switches away with half a cycle of buffered completions. Everything else the trainer
keeps between steps lives on the run's own trainer (generation buffer, step counter, metrics)
and in its random streams, which the engine saves and restores with the run: generation samples
from the run's own stream.
"""

from __future__ import annotations

import math
from typing import Any

from .run_trainer import RunTrainerMixin

__all__ = ["GenerationLoopHooks", "generation_cycle_steps"]


def generation_cycle_steps(args: Any) -> int:
    """Optimizer steps in the smallest span of whole generation cycles and whole accumulation
    groups: chunk boundaries fall on multiples of it. A config without ``steps_per_generation``
    (Distillation) generates once per accumulation group."""
    accumulation = args.gradient_accumulation_steps
    per_generation = getattr(args, "steps_per_generation", None) or accumulation
    cycle = per_generation * getattr(args, "num_iterations", 1)
    return math.lcm(cycle, accumulation) // accumulation


class GenerationLoopHooks(RunTrainerMixin):
    """One run's trainer of a kind that generates in its training loop."""

    # Its plan counts what its repeating sampler yields, and chunks end on whole generation
    # cycles: both read from a built trainer.
    rf_builds_when_scheduled = False

    def rf_step_multiple(self) -> int:
        return generation_cycle_steps(self.args)

    def rf_stateful(self) -> list[Any]:
        # Reward functions that keep state between calls opt in by offering
        # state_dict()/load_state_dict(); each run then sees only its own calls' effects.
        return [f for f in getattr(self, "reward_funcs", None) or []
                if callable(getattr(f, "state_dict", None))
                and callable(getattr(f, "load_state_dict", None))]

    def rf_num_batches(self) -> int | None:
        # The sampler repeats every generation batch: count what its dataloader yields
        # (streamed data has no length: its chunks are cut by steps).
        try:
            return len(self.get_train_dataloader())
        except TypeError:
            return None
