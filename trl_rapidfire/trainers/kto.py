"""``RFKTOTrainer``: TRL's ``KTOTrainer`` over many configurations at once.

KTO learns from unpaired feedback (a completion and a thumbs-up or down). With a PEFT config
and no ``ref_model`` the reference is the shared base model with the adapters disabled,
exactly as a plain ``KTOTrainer`` given ``peft_config`` computes it (as for DPO): N runs hold
one base model. The KL batches (each batch's completions rotated by one) are built by TRL's
own dataset preparation, shared by the runs whose settings agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trl import KTOTrainer

from ..config.configs import RFKTOConfig
from ..config.dataset_checks import check_kto_dataset
from ..search.searches import Search
from .base import RFTrainerMixin
from .construction import each_dataset, experiment_config, trainer_arguments
from .prepared_data import prepared_once
from .run_trainer import RunTrainerMixin

__all__ = ["RFKTOTrainer"]


class _RunKTOHooks(RunTrainerMixin):
    """One run's ``KTOTrainer``. Dataset preparation (prompt extraction, tokenization,
    truncation, KL completions) is shared through ``rf_dataset_memo`` by runs whose settings
    agree."""

    def __init__(self, *args: Any, rf_dataset_memo: dict | None = None, **kwargs: Any) -> None:
        self._rf_dataset_memo = rf_dataset_memo
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        # What KTOTrainer._prepare_dataset reads: the KL completions are rotated within
        # batches of per_device_train_batch_size, when the loss needs them.
        kl = self.calculate_KL
        key = (id(dataset), id(processing_class), dataset_name, args.dataset_num_proc,
               args.max_length, kl, args.per_device_train_batch_size if kl else None)
        return prepared_once(
            self._rf_dataset_memo, key, (dataset, processing_class),
            lambda: super(_RunKTOHooks, self)._prepare_dataset(dataset, processing_class, args,
                                                                dataset_name))


class RFKTOTrainer(RFTrainerMixin, KTOTrainer):
    """``KTOTrainer`` for a config group: every combination of knobs is a run, all runs train
    together chunk by chunk, each ending exactly as it would alone.

    Takes ``KTOTrainer``'s arguments; ``args`` is usually an :class:`~trl_rapidfire.RFKTOConfig`
    (``beta=List([...])``, ``desirable_weight=List([...])``, ...); ``model``, ``peft_config``
    and ``compute_metrics`` may be ``List``s; with the config's ``generation_config`` the runs
    answer the eval prompts and are scored against the desirable completions. ``search``:
    ``GridSearch()`` (default), ``RandomSearch(...)`` or ``OptunaSearch(...)``. See
    :class:`~trl_rapidfire.RFSFTTrainer` for what the trainer offers after ``train()``.
    """

    _rf_run_hooks = _RunKTOHooks
    _rf_knob_arguments = ("model", "peft_config", "processing_class", "compute_metrics")
    # A generation eval's reference: the completion (see generation_eval.py).
    rf_reference_column = "completion"

    def __init__(
        self,
        model: Any,
        ref_model: Any = None,
        args: Any = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        compute_metrics: Callable | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        *,
        search: Search | None = None,
        policy: Any = None,
    ) -> None:
        arguments = trainer_arguments(locals())  # first: nothing else in locals() yet
        config = experiment_config(arguments, args, RFKTOConfig, "KTO",
                                   each_dataset(check_kto_dataset))
        self._rf_setup(
            args=config,
            search=search,
            policy=policy,
            arguments=arguments,
            rf_dataset_memo={},
        )
