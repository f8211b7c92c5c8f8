"""How the trainer the user holds and the runs' trainers relate, as classes.

The user's class (an ``RF*Trainer``, or the user's subclass of one) is the class every run
trains with: :func:`run_class_for` puts the trainer kind's run hooks in front of it, so the
user's overrides (``compute_loss``, ``training_step``, ``log``, ...) run on every run and
``super()`` in them reaches the TRL trainer. The RF trainer's own methods (``train``,
``save_model``, the callbacks' management) are the experiment's: on a run's trainer they step
aside for the TRL trainer's (:func:`as_trl_on_runs`). A few public methods a script calls on
the trainer it holds are answered by the best run's trainer (:data:`FORWARDED`); everything
else is the TRL trainer's own, static and class methods included.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from .run_trainer import RunTrainerMixin

__all__ = ["FORWARDED", "as_trl_on_runs", "check_overrides", "forward_to_best_run",
           "run_class_for"]

# What a script calls on the trainer it holds, that the best run's trainer answers (the
# Trainer's other methods are the TRL trainer's own; the attributes they read are the best
# run's, through the RF trainer's __getattr__).
FORWARDED = (
    "evaluate", "predict", "push_to_hub", "create_model_card", "save_state", "log_metrics",
    "save_metrics", "metrics_format", "get_train_dataloader", "get_eval_dataloader",
    "get_test_dataloader", "is_world_process_zero", "is_local_process_zero",
    "get_num_trainable_parameters", "get_learning_rates", "get_optimizer_group", "num_tokens",
    "num_examples",
)  # fmt: skip

# Methods the engine owns on every run: a subclass overriding them would change how a run is
# trained in chunks, not what it trains.
_ENGINE_OWNED = ("train", "_inner_training_loop")

_RUN_CLASSES: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()


def run_class_for(experiment_class: type, hooks: type) -> type:
    """The class of a run's trainer in an experiment of ``experiment_class``.

    Its MRO is ``hooks`` (a :class:`RunTrainerMixin` with the trainer kind's own hooks), then
    ``experiment_class`` and everything above it: a method patched on any class of the chain
    reaches the runs."""
    cached = _RUN_CLASSES.get(experiment_class)
    if cached is not None:
        return cached
    trl_class = next(k for k in experiment_class.__mro__ if k.__module__.split(".")[0] == "trl")
    run_class = type(f"{experiment_class.__name__}Run", (hooks, experiment_class), {
        "__module__": experiment_class.__module__, "rf_trl_class": trl_class,
        "__doc__": f"One run's trainer in an experiment of {experiment_class.__name__}.",
    })
    _RUN_CLASSES[experiment_class] = run_class
    return run_class


def as_trl_on_runs(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of the experiment; on a run's trainer the TRL trainer's own instead (the RF
    trainer's class is in the run class's MRO, right before the TRL trainer)."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self, RunTrainerMixin):
            return getattr(self.rf_trl_class, name)(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    return wrapper


def forward_to_best_run(name: str) -> Callable[..., Any]:
    """The experiment's ``name``: the best run's trainer's, in that run's accelerate state."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._rf_as_current() as trainer:
            return getattr(trainer, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` of the best run's trainer (before ``train()``: the first run's)."
    return as_trl_on_runs(method)


def check_overrides(experiment_class: type) -> None:
    """Refuse a user's subclass that overrides what the engine owns, naming the method."""
    for klass in experiment_class.__mro__:
        if klass.__module__.split(".")[0] == "trl_rapidfire":
            break
        for name in _ENGINE_OWNED:
            if name in vars(klass):
                raise TypeError(
                    f"{klass.__name__}.{name} overrides what trl-rapidfire owns: it trains "
                    "every run in chunks, suspending and resuming each run's own train(). "
                    "Override the step instead (compute_loss, training_step, "
                    "prediction_step, log, create_optimizer, ...), or use a callback."
                )
