"""``RFRLOOTrainer``: TRL's ``RLOOTrainer`` over many configurations at once.

RLOO generates inside its training loop as GRPO does (the leave-one-out baseline replaces the
group's mean): the same hooks serve both (:mod:`.generation_loop`): chunks end on whole
generation cycles, each run samples from its own random streams, and reward functions that
keep state keep one state per run. Reward functions may be knobs, usually zipped with
``reward_weights`` (``GridSearch(zip=[("reward_funcs", "reward_weights")])``), and so may
``num_generations``.
"""

from __future__ import annotations

from typing import Any

from trl import RLOOTrainer

from ..config.configs import RFRLOOConfig
from ..config.dataset_checks import check_grpo_dataset
from ..search.searches import Search
from .base import RFTrainerMixin
from .construction import each_dataset, experiment_config, trainer_arguments
from .generation_loop import GenerationLoopHooks

__all__ = ["RFRLOOTrainer"]


class RFRLOOTrainer(RFTrainerMixin, RLOOTrainer):
    """``RLOOTrainer`` for a config group: every combination of knobs is a run, all runs train
    together chunk by chunk (on whole generation cycles), each ending exactly as it would alone.

    Takes ``RLOOTrainer``'s arguments; ``args`` is usually an
    :class:`~trl_rapidfire.RFRLOOConfig`; ``model``, ``peft_config`` and ``reward_funcs`` may
    be ``List``s. ``search``: ``GridSearch()`` (default), ``RandomSearch(...)`` or
    ``OptunaSearch(...)``.
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
        *,
        search: Search | None = None,
        policy: Any = None,
    ) -> None:
        arguments = trainer_arguments(locals())  # first: nothing else in locals() yet
        config = experiment_config(arguments, args, RFRLOOConfig, "RLOO",
                                   each_dataset(check_grpo_dataset, kind="RLOO"))
        self._rf_setup(
            args=config,
            search=search,
            policy=policy,
            arguments=arguments,
        )
