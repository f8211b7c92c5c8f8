"""``RFDistillationTrainer``: TRL's ``DistillationTrainer`` over many configurations at once.

On-policy distillation: the student generates completions and learns the teacher's
next-token distribution on them. Each run trains its own student adapter on the shared base
model; the teacher is resident once and shared by every run that names it
(:mod:`.resident_models`): ``teacher_model`` may be a knob, and each distinct teacher is loaded
once. The student generates inside its training loop, so its chunks end on whole generation
cycles with its own random streams, as GRPO's do (:mod:`.generation_loop`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from trl import DistillationTrainer

from ..config.configs import RFDistillationConfig
from ..config.dataset_checks import check_grpo_dataset
from ..search.searches import Search
from .base import RFTrainerMixin
from .construction import each_dataset, experiment_config, trainer_arguments
from .generation_loop import GenerationLoopHooks
from .resident_models import ResidentModels

__all__ = ["RFDistillationTrainer"]


class _RunDistillationHooks(GenerationLoopHooks):
    """One run's ``DistillationTrainer``, given the resident teacher instead of its path."""

    def __init__(self, *args: Any, rf_teachers: ResidentModels | None = None,
                 **kwargs: Any) -> None:
        teacher = kwargs.get("teacher_model")
        config = kwargs.get("args")
        if rf_teachers is None or not isinstance(teacher, str) or config is None:
            super().__init__(*args, **kwargs)
            return
        kwargs["teacher_model"] = rf_teachers.get(teacher, _teacher_load_kwargs(config))
        with _load_arguments_used(config):
            super().__init__(*args, **kwargs)


def _teacher_load_kwargs(config: Any) -> dict[str, Any]:
    """The load arguments ``DistillationTrainer`` gives a teacher named by path (a run's world
    is one process: no device map to clear)."""
    kwargs = dict(config.teacher_model_init_kwargs or {})
    dtype = kwargs.get("dtype")
    kwargs["dtype"] = dtype if dtype in ("auto", None) else getattr(torch, dtype)
    if config.teacher_model_revision is not None:
        kwargs.setdefault("revision", config.teacher_model_revision)
    kwargs.setdefault("trust_remote_code", config.trust_remote_code)
    return kwargs


@contextlib.contextmanager
def _load_arguments_used(config: Any) -> Iterator[None]:
    """The teacher's load arguments taken out of ``config`` while its trainer is built: they
    were used to load the resident teacher, and TRL refuses them beside a loaded model. The
    config reads as the user wrote it afterwards."""
    kept = config.teacher_model_init_kwargs
    config.teacher_model_init_kwargs = None
    try:
        yield
    finally:
        config.teacher_model_init_kwargs = kept


class RFDistillationTrainer(RFTrainerMixin, DistillationTrainer):
    """``DistillationTrainer`` for a config group: every combination of knobs is a run, all
    runs train together chunk by chunk, each ending exactly as it would alone.

    Takes ``DistillationTrainer``'s arguments; ``args`` is usually an
    :class:`~trl_rapidfire.RFDistillationConfig` (``beta=List([...])``, ``temperature``, ...);
    ``model``, ``teacher_model`` (each distinct teacher loaded once), ``peft_config`` and
    ``processing_class`` may be ``List``s. ``search``: ``GridSearch()`` (default),
    ``RandomSearch(...)`` or ``OptunaSearch(...)``.
    """

    _rf_knob_arguments = ("model", "teacher_model", "peft_config", "processing_class")
    _rf_run_hooks = _RunDistillationHooks

    def __init__(
        self,
        model: Any,
        teacher_model: Any = None,
        args: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list | None = None,
        *,
        search: Search | None = None,
        policy: Any = None,
    ) -> None:
        arguments = trainer_arguments(locals())  # first: nothing else in locals() yet
        config = experiment_config(arguments, args, RFDistillationConfig, "Distillation",
                                   each_dataset(check_grpo_dataset, kind="Distillation"))
        self._rf_teachers = ResidentModels()
        self._rf_setup(
            args=config,
            search=search,
            policy=policy,
            arguments=arguments,
            rf_teachers=self._rf_teachers,
        )

    @property
    def teacher_loads(self) -> dict[str, int]:
        """How many times each teacher path was loaded (once each: the runs share it)."""
        return dict(self._rf_teachers.loads)
