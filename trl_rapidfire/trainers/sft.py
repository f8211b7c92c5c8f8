"""``RFSFTTrainer``: TRL's ``SFTTrainer`` over many configurations at once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trl import SFTTrainer

from ..config.configs import RFConfigError, RFSFTConfig
from ..config.dataset_checks import check_sft_dataset
from ..config.preflight import PreflightError
from ..search.searches import Search
from .base import RFTrainerMixin
from .construction import experiment_config, trainer_arguments
from .prepared_data import prepared_once
from .run_trainer import RunTrainerMixin

__all__ = ["RFSFTTrainer"]

# The SFTConfig fields that SFTTrainer's dataset preparation reads: runs that agree on all of
# them (and on dataset, tokenizer and formatting function) share one prepared dataset.
_PREP_FIELDS = (
    "dataset_text_field", "max_length", "truncation_mode", "packing_strategy", "padding_free",
    "dataset_num_proc", "assistant_only_loss", "eos_token", "pad_token", "chat_template_path",
    "dataset_kwargs", "shuffle_dataset",
)  # fmt: skip


class _RunSFTHooks(RunTrainerMixin):
    """One run's ``SFTTrainer``. Dataset preparation (formatting, tokenization, packing) is
    shared through ``rf_dataset_memo`` by the runs whose preparation settings agree."""

    def __init__(self, *args: Any, rf_dataset_memo: dict | None = None, **kwargs: Any) -> None:
        self._rf_dataset_memo = rf_dataset_memo
        config = kwargs.get("args")
        if config is not None:
            # Per run: dataset_text_field and formatting_func may be knobs. An RFConfigError is
            # what the setup re-raises rather than marking only this run failed.
            try:
                for label in ("train_dataset", "eval_dataset"):
                    check_sft_dataset(kwargs.get(label), config, label=label,
                                      formatting_func=kwargs.get("formatting_func"))
            except PreflightError as err:
                raise RFConfigError(f"{Path(config.output_dir).name}: {err}") from None
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func,
                         dataset_name):
        key = (
            id(dataset), id(processing_class), id(formatting_func), dataset_name, packing,
            tuple(repr(getattr(args, f, None)) for f in _PREP_FIELDS),
            args.seed if args.shuffle_dataset or packing else None,
            self.completion_only_loss, repr(self.chat_template), self._is_vision_dataset,
        )
        return prepared_once(
            self._rf_dataset_memo, key, (dataset, processing_class, formatting_func),
            lambda: super(_RunSFTHooks, self)._prepare_dataset(
                dataset, processing_class, args, packing, formatting_func, dataset_name))

class RFSFTTrainer(RFTrainerMixin, SFTTrainer):
    """``SFTTrainer`` for a config group: every combination of knobs is a run, and all runs
    train together, chunk by chunk, each ending exactly as it would alone.

    Takes ``SFTTrainer``'s arguments. ``args`` is usually an :class:`~trl_rapidfire.RFSFTConfig`
    whose fields may hold ``List``/``Range`` knobs; ``model``, ``peft_config``,
    ``formatting_func``, ``processing_class`` and ``compute_metrics`` may be ``List``s too.
    With the config's ``generation_config``, ``compute_metrics`` scores decoded answers
    (``docs/evaluation.md``).

    Args:
        search: how knobs expand into runs: ``GridSearch()`` (default) or
            ``RandomSearch(num_runs=..., seed=...)``.
        policy: automatic control at chunk boundaries (``SuccessiveHalving(...)``,
            ``Budget(...)``, or a list of them); see :mod:`trl_rapidfire.control.policies`.

    After :meth:`train`: ``trainer.runs`` lists every run with its metrics, ``trainer.best_run``
    names the best, ``trainer.model`` is the best run's model, ``trainer.save_model()`` saves
    the best run's weights, and ``trainer.schedule`` tells which chunk ran when. Each run's
    final adapter/model is in ``<output_dir>/runs/<run>/final/``.
    """

    _rf_knob_arguments = ("model", "peft_config", "formatting_func", "processing_class",
                          "compute_metrics")
    # A generation eval's reference for a prompt/completion row (see generation_eval.py).
    rf_reference_column = "completion"
    _rf_run_hooks = _RunSFTHooks

    def __init__(
        self,
        model: Any,
        args: Any = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        optimizer_cls_and_kwargs: tuple | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
        quantization_config: Any = None,
        peft_config: Any = None,
        formatting_func: Any = None,
        *,
        search: Search | None = None,
        policy: Any = None,
    ) -> None:
        arguments = trainer_arguments(locals())  # first: nothing else in locals() yet
        config = experiment_config(arguments, args, RFSFTConfig, "SFT")
        self._rf_setup(
            args=config,
            search=search,
            policy=policy,
            arguments=arguments,
            rf_dataset_memo={},
        )
