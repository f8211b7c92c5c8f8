"""``RFGRPOTrainer``: TRL's ``GRPOTrainer`` over many configurations at once.

A GRPO generation cycle spans ``steps_per_generation x num_iterations`` micro-steps: completions
are generated once and consumed slice by slice. Chunk boundaries are rounded to whole cycles
(and whole gradient-accumulation groups), so a run never switches away with half a cycle of
buffered completions. Everything else that GRPO keeps between steps lives on the run's own
trainer (generation buffer, step counter, metrics) and in its RNG streams, which the engine
saves and restores with the run: generation samples from the run's own stream.

Reward functions may be knobs: ``reward_funcs=List([[f, g], [f]])``, usually zipped with
``reward_weights`` (``GridSearch(zip=[("reward_funcs", "reward_weights")])``). Plain functions
need nothing. A reward function that keeps state between calls (a counter, a curriculum, a
cache) is one object shared by the runs that use it: it opts in by offering ``state_dict()``
and ``load_state_dict(state)``, and every run then gets back its own state at each turn.
"""

from __future__ import annotations

import math
from typing import Any

from trl import GRPOTrainer

from ..config.configs import RFConfigError, RFGRPOConfig
from ..config.dataset_checks import check_dataset_rows, check_grpo_dataset
from ..config.preflight import PreflightError
from ..search.searches import Search
from .base import RFTrainerMixin, default_output_dir, rf_config_from, trainer_arguments
from .run_trainer import RunTrainerMixin

__all__ = ["RFGRPOTrainer", "generation_cycle_steps"]


def generation_cycle_steps(args: Any) -> int:
    """Optimizer steps in the smallest span of whole generation cycles and whole accumulation
    groups: chunk boundaries fall on multiples of it."""
    cycle = args.steps_per_generation * args.num_iterations
    accumulation = args.gradient_accumulation_steps
    return math.lcm(cycle, accumulation) // accumulation


class _RunGRPOHooks(RunTrainerMixin):
    """One run's ``GRPOTrainer``."""

    # Its plan counts what its repeating sampler yields, and chunks end on whole generation
    # cycles: both read from a built trainer.
    rf_builds_when_scheduled = False

    def rf_step_multiple(self) -> int:
        return generation_cycle_steps(self.args)

    def rf_stateful(self) -> list[Any]:
        # Reward functions that keep state between calls opt in by offering
        # state_dict()/load_state_dict(); each run then sees only its own calls' effects.
        return [f for f in self.reward_funcs
                if callable(getattr(f, "state_dict", None))
                and callable(getattr(f, "load_state_dict", None))]

    def rf_num_batches(self) -> int | None:
        # GRPO's sampler repeats every generation batch: count what its dataloader yields
        # (streamed data has no length: its chunks are cut by steps).
        try:
            return len(self.get_train_dataloader())
        except TypeError:
            return None


class RFGRPOTrainer(RFTrainerMixin, GRPOTrainer):
    """``GRPOTrainer`` for a config group: every combination of knobs is a run, all runs train
    together chunk by chunk (on whole generation cycles), each ending exactly as it would alone.

    Takes ``GRPOTrainer``'s arguments; ``args`` is usually an
    :class:`~trl_rapidfire.RFGRPOConfig`; ``model``, ``peft_config`` and ``reward_funcs`` may
    be ``List``s. ``search``: ``GridSearch()`` (default) or ``RandomSearch(...)``.
    """

    _rf_knob_arguments = ("model", "peft_config", "reward_funcs", "processing_class")
    _rf_run_hooks = _RunGRPOHooks

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list | None = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
        *,
        search: Search | None = None,
        policy: Any = None,
    ) -> None:
        arguments = trainer_arguments(locals())  # first: nothing else in locals() yet
        if train_dataset is None:
            raise ValueError("`train_dataset` is required")
        try:  # before any model loads
            if environment_factory is None:
                check_grpo_dataset(train_dataset, label="train_dataset")
                check_grpo_dataset(eval_dataset, label="eval_dataset")
            else:  # the environment may supply the prompts (its reset())
                check_dataset_rows({"train_dataset": train_dataset, "eval_dataset": eval_dataset})
        except PreflightError as err:
            raise RFConfigError(str(err)) from None
        self._rf_setup(
            args=rf_config_from(args, RFGRPOConfig, default_output_dir(model, "GRPO")),
            search=search,
            policy=policy,
            arguments=arguments,
        )
