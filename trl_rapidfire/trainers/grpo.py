"""``RFGRPOTrainer``: TRL's ``GRPOTrainer`` over many configurations at once.

Chunks end on whole generation cycles (``steps_per_generation x num_iterations`` micro-steps),
as for every kind that generates in its training loop (:mod:`.generation_loop`).

Reward functions may be knobs: ``reward_funcs=List([[f, g], [f]])``, usually zipped with
``reward_weights`` (``GridSearch(zip=[("reward_funcs", "reward_weights")])``). Plain functions
need nothing. A reward function that keeps state between calls (a counter, a curriculum, a
cache) is one object shared by the runs that use it: it opts in by offering ``state_dict()``
and ``load_state_dict(state)``, and every run then gets back its own state at each turn.
"""

from __future__ import annotations

from typing import Any

from trl import GRPOTrainer

from ..config.configs import RFGRPOConfig
from ..config.dataset_checks import check_grpo_dataset
from ..search.searches import Search
from .base import RFTrainerMixin
from .construction import each_dataset, experiment_config, trainer_arguments
from .generation_loop import GenerationLoopHooks, generation_cycle_steps

__all__ = ["RFGRPOTrainer", "generation_cycle_steps"]


class RFGRPOTrainer(RFTrainerMixin, GRPOTrainer):
    """``GRPOTrainer`` for a config group: every combination of knobs is a run, all runs train
    together chunk by chunk (on whole generation cycles), each ending exactly as it would alone.

    Takes ``GRPOTrainer``'s arguments; ``args`` is usually an
    :class:`~trl_rapidfire.RFGRPOConfig`; ``model``, ``peft_config`` and ``reward_funcs`` may
    be ``List``s. ``search``: ``GridSearch()`` (default) or ``RandomSearch(...)``.
    """

    _rf_knob_arguments = ("model", "peft_config", "reward_funcs", "processing_class")
    _rf_run_hooks = GenerationLoopHooks

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
        # An environment may supply the prompts (its reset()): then rows are all it needs.
        check = each_dataset(check_grpo_dataset) if environment_factory is None else None
        self._rf_setup(
            args=experiment_config(arguments, args, RFGRPOConfig, "GRPO", check),
            search=search,
            policy=policy,
            arguments=arguments,
        )
