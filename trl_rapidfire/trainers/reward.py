"""``RFRewardTrainer``: TRL's ``RewardTrainer`` over many configurations at once.

A reward model is a sequence classifier: the base model loads as
``AutoModelForSequenceClassification`` with one label, and its new score head is drawn from the
seed set right before the load, as in TRL (so the pool loads it once per seed). With LoRA
(``task_type="SEQ_CLS"``) PEFT trains each run's own copy of the head beside its adapter
(``modules_to_save``): that copy is part of the run's state, swapped, cached, checkpointed,
resumed and cloned with the adapter. Runs report ``eval_accuracy`` (chosen scored above
rejected) besides ``eval_loss``: ``SuccessiveHalving("eval_accuracy", mode="max")`` judges on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import AutoModelForSequenceClassification
from trl import RewardTrainer

from ..config.configs import RFRewardConfig
from ..config.dataset_checks import check_dpo_dataset
from ..runtime.model_pool import BaseModelLoad
from ..search.searches import Search
from .base import RFTrainerMixin
from .construction import each_dataset, experiment_config, trainer_arguments
from .prepared_data import prepared_once
from .run_trainer import RunTrainerMixin

__all__ = ["RFRewardTrainer"]


class _RunRewardHooks(RunTrainerMixin):
    """One run's ``RewardTrainer``: its base model a one-label sequence classifier, seeded at
    load; dataset preparation (EOS, tokenization, length filter) shared through
    ``rf_dataset_memo`` by runs whose settings agree."""

    rf_base_load = BaseModelLoad(AutoModelForSequenceClassification, seeded=True,
                                 init_kwargs=(("num_labels", 1),))

    def __init__(self, *args: Any, rf_dataset_memo: dict | None = None, **kwargs: Any) -> None:
        self._rf_dataset_memo = rf_dataset_memo
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        # What RewardTrainer._prepare_dataset reads, and the tokenizer's EOS it appends.
        key = (id(dataset), id(processing_class), dataset_name, args.dataset_num_proc,
               args.max_length, processing_class.eos_token)
        return prepared_once(
            self._rf_dataset_memo, key, (dataset, processing_class),
            lambda: super(_RunRewardHooks, self)._prepare_dataset(dataset, processing_class,
                                                                   args, dataset_name))


class RFRewardTrainer(RFTrainerMixin, RewardTrainer):
    """``RewardTrainer`` for a config group: every combination of knobs is a run, all runs
    train together chunk by chunk, each ending exactly as it would alone.

    Takes ``RewardTrainer``'s arguments; ``args`` is usually an
    :class:`~trl_rapidfire.RFRewardConfig`; ``model``, ``peft_config`` (LoRA with
    ``task_type="SEQ_CLS"``) and ``compute_metrics`` may be ``List``s. ``search``:
    ``GridSearch()`` (default), ``RandomSearch(...)`` or ``OptunaSearch(...)``. See
    :class:`~trl_rapidfire.RFSFTTrainer` for what the trainer offers after ``train()``.
    """

    _rf_run_hooks = _RunRewardHooks
    _rf_knob_arguments = ("model", "peft_config", "processing_class", "compute_metrics")

    def __init__(
        self,
        model: Any,
        args: Any = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        compute_metrics: Callable | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        optimizer_cls_and_kwargs: tuple | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
        quantization_config: Any = None,
        peft_config: Any = None,
        *,
        search: Search | None = None,
        policy: Any = None,
    ) -> None:
        arguments = trainer_arguments(locals())  # first: nothing else in locals() yet
        config = experiment_config(arguments, args, RFRewardConfig, "Reward",
                                   each_dataset(check_dpo_dataset, kind="Reward"))
        self._rf_setup(
            args=config,
            search=search,
            policy=policy,
            arguments=arguments,
            rf_dataset_memo={},
        )
