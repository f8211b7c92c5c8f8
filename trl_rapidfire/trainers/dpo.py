"""``RFDPOTrainer``: TRL's ``DPOTrainer`` over many configurations at once.

With a PEFT config and no ``ref_model``, the reference is the shared base model with the
adapters disabled, exactly as a plain ``DPOTrainer`` given ``peft_config`` computes it: N DPO
runs on one base model hold one base model, not N + 1 copies. An explicit ``ref_model`` keeps
TRL's meaning and is shared by every run that names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trl import DPOTrainer

from ..config.configs import RFDPOConfig
from ..config.dataset_checks import check_dpo_dataset
from ..search.searches import Search
from .base import RFTrainerMixin
from .construction import each_dataset, experiment_config, trainer_arguments
from .prepared_data import prepared_once
from .run_trainer import RunTrainerMixin

__all__ = ["RFDPOTrainer"]


class _RunDPOHooks(RunTrainerMixin):
    """One run's ``DPOTrainer``. Dataset preparation (prompt extraction, EOS, tokenization,
    truncation) is shared through ``rf_dataset_memo`` by runs whose settings agree."""

    def __init__(self, *args: Any, rf_dataset_memo: dict | None = None, **kwargs: Any) -> None:
        self._rf_dataset_memo = rf_dataset_memo
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        # The DPOConfig fields DPOTrainer._prepare_dataset reads, and the tokenizer's EOS.
        key = (id(dataset), id(processing_class), dataset_name, args.dataset_num_proc,
               args.max_length, args.truncation_mode, self._tokenizer.eos_token)
        return prepared_once(
            self._rf_dataset_memo, key, (dataset, processing_class),
            lambda: super(_RunDPOHooks, self)._prepare_dataset(dataset, processing_class, args,
                                                                dataset_name))

class RFDPOTrainer(RFTrainerMixin, DPOTrainer):
    """``DPOTrainer`` for a config group: every combination of knobs is a run, all runs train
    together chunk by chunk, each ending exactly as it would alone.

    Takes ``DPOTrainer``'s arguments; ``args`` is usually an :class:`~trl_rapidfire.RFDPOConfig`
    (``beta=List([...])``, ``loss_type=List([...])``, ...); ``model``, ``peft_config`` and
    ``compute_metrics`` may be ``List``s; with the config's ``generation_config`` the runs
    answer the eval prompts and are scored against the chosen answers. ``search``:
    ``GridSearch()`` (default) or ``RandomSearch(...)``. See
    :class:`~trl_rapidfire.RFSFTTrainer` for what the trainer offers after ``train()``.
    """

    _rf_run_hooks = _RunDPOHooks
    _rf_knob_arguments = ("model", "peft_config", "processing_class", "compute_metrics")
    # A generation eval's reference: the chosen answer (see generation_eval.py).
    rf_reference_column = "chosen"

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
        config = experiment_config(arguments, args, RFDPOConfig, "DPO",
                                   each_dataset(check_dpo_dataset))
        self._rf_setup(
            args=config,
            search=search,
            policy=policy,
            arguments=arguments,
            rf_dataset_memo={},
        )
