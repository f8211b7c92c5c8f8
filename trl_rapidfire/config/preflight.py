"""Pre-flight checks: what TRL only checks when a trainer is built or at the first step.

TRL accepts, say, ``DPOConfig(loss_type="sigmod")`` and fails minutes later in the first loss
computation; ``learning_rate="abc"``, ``per_device_train_batch_size=0`` or ``seed=2.5`` pass
``TrainingArguments`` too and fail at the first step. With many runs that means one run dying
mid-experiment; here every run's concrete config (and its trainer-level values, and the datasets)
is checked before any training starts.

Field types are read from the TRL config's own annotations (``int``, ``float``, ``bool``,
optionally ``| None``); a field with any other annotation is not type-checked.

The accepted names are read from TRL's own field metadata (``choices``) or, where TRL only lists
them in the field's help text, from that text; a field whose list cannot be read is not checked,
so a TRL upgrade can never make a valid value fail here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .fields import allowed_values

__all__ = ["PreflightError", "allowed_values", "check_field_values", "check_run", "scalar_kind"]


class PreflightError(ValueError):
    """A run's values would make TRL fail once training starts."""


# (config class name, field) whose string values TRL checks late or never.
_NAMED_VALUE_FIELDS = {
    "SFTConfig": ("loss_type", "packing_strategy", "truncation_mode"),
    "DPOConfig": ("loss_type", "f_divergence_type", "truncation_mode"),
    "GRPOConfig": ("loss_type", "importance_sampling_level"),
}


def _trl_base(config: Any) -> type | None:
    for cls in type(config).__mro__:
        if cls.__name__ in _NAMED_VALUE_FIELDS and cls.__module__.startswith("trl."):
            return cls
    return None


def _check_named_values(config: Any) -> None:
    base = _trl_base(config)
    if base is None:
        return
    for name in _NAMED_VALUE_FIELDS[base.__name__]:
        allowed = allowed_values(base, name)
        if allowed is None:
            continue
        value = getattr(config, name)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if str(getattr(item, "value", item)) not in allowed:
                raise PreflightError(
                    f"`{name}`={item!r} is not a {base.__name__} {name}; TRL accepts "
                    f"{sorted(allowed)}."
                )


def _check_reward_weights(config: Any, trainer_kwargs: Mapping[str, Any]) -> None:
    weights = getattr(config, "reward_weights", None)
    if weights is None or "reward_funcs" not in trainer_kwargs:
        return
    funcs = trainer_kwargs["reward_funcs"]
    count = len(funcs) if isinstance(funcs, (list, tuple)) else 1
    if len(weights) != count:
        raise PreflightError(
            f"`reward_weights` has {len(weights)} weight(s) for {count} reward function(s). "
            "Give one weight per function; to vary both together use "
            'GridSearch(zip=[("reward_funcs", "reward_weights")]).'
        )


def check_run(config: Any, trainer_kwargs: Mapping[str, Any]) -> None:
    """Raise :class:`PreflightError` if this run would fail once its trainer is built."""
    check_field_values(type(config), {f.name: getattr(config, f.name)
                                      for f in dataclasses.fields(config) if f.init})
    _check_named_values(config)
    _check_reward_weights(config, trainer_kwargs)
    _check_scheduler_kwargs(config)
    _check_report_to(config)
    _check_trainer_values(trainer_kwargs)


def _check_scheduler_kwargs(config: Any) -> None:
    """Unknown ``lr_scheduler_kwargs`` fail in the schedule function, when training starts."""
    kwargs = getattr(config, "lr_scheduler_kwargs", None)
    if not isinstance(kwargs, Mapping) or not kwargs:
        return
    try:
        from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
        from transformers.trainer_utils import SchedulerType

        kind = SchedulerType(config.lr_scheduler_type)
        params = inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[kind]).parameters
    except Exception:  # noqa: BLE001 - a schedule we cannot inspect is not checked
        return
    # get_scheduler ignores the kwargs of these two, and passes these three itself.
    if kind in (SchedulerType.CONSTANT, SchedulerType.CONSTANT_WITH_WARMUP) or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = sorted(set(params) - {"optimizer", "num_warmup_steps", "num_training_steps"})
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise PreflightError(
            f"`lr_scheduler_kwargs` sets {unknown}, which the {kind.value!r} schedule does not "
            f"take; it takes {accepted}. Remove them, or set the lr_scheduler_type they are for."
        )


def _check_report_to(config: Any) -> None:
    """An unknown ``report_to`` name fails when the trainer is built."""
    try:
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
    except ImportError:
        return
    names = getattr(config, "report_to", None)
    for name in [names] if isinstance(names, str) else names or []:
        if isinstance(name, str) and name not in {*INTEGRATION_TO_CALLBACK, "all", "none"}:
            raise PreflightError(
                f"`report_to`={name!r} is not a reporting integration; transformers knows "
                f"{sorted(INTEGRATION_TO_CALLBACK)} (and 'all', 'none')."
            )


# --------------------------------------------------------------------------------------------
# Field types and ranges
# --------------------------------------------------------------------------------------------


def scalar_kind(tp: Any) -> str | None:
    """``"bool"``, ``"int"``, ``"float"`` (optionally ``| None``), ``"float_list"``
    (``list[float]``), ``"int_or_str"`` (a Range there draws integers; values unchecked) or None.
    ``str`` is None: transformers reads some str fields more widely (``fsdp`` takes ``True``)."""
    members = [m for m in _members(tp) if m is not type(None)]
    origins = {typing.get_origin(m) or m for m in members}
    if origins == {list} and all(typing.get_args(m) in ((float,), (int,)) for m in members):
        return "float_list"
    if not members or not all(isinstance(m, type) for m in members):
        return None
    numeric = [m for m in members if m in (int, float)]
    if set(members) == {bool}:
        return "bool"
    if numeric and set(members) <= {int, float}:
        return "float" if float in numeric else "int"
    if set(members) == {int, str}:
        return "int_or_str"
    return None


def _members(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


@functools.cache
def _field_specs(config_class: type) -> dict[str, tuple[str, bool, Any]]:
    """field -> (kind, None allowed, default) for the fields whose values are checked here."""
    try:
        hints = typing.get_type_hints(config_class)
    except Exception:  # noqa: BLE001 - an annotation we cannot resolve: check nothing
        return {}
    specs = {}
    for fld in dataclasses.fields(config_class):
        tp = hints.get(fld.name)
        kind = scalar_kind(tp)
        if kind is None or kind == "int_or_str":
            continue
        default = None if fld.default is dataclasses.MISSING else fld.default
        specs[fld.name] = (kind, type(None) in _members(tp), default)
    return specs


def _finite_at_least(low: float) -> Callable[[Any], bool]:
    return lambda v: math.isfinite(v) and v >= low


# Values TRL and transformers accept when the config is built but fail on (or silently
# misuse) once training starts: the optimizer, the DataLoader, NumPy's seeding, generation.
_BOUNDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "learning_rate": (_finite_at_least(0), "a finite number >= 0"),
    "per_device_train_batch_size": (lambda v: v >= 1, "an integer >= 1"),
    "per_device_eval_batch_size": (lambda v: v >= 1, "an integer >= 1"),
    "gradient_accumulation_steps": (lambda v: v >= 1, "an integer >= 1"),
    "eval_accumulation_steps": (lambda v: v >= 1, "an integer >= 1, or None"),
    "seed": (lambda v: 0 <= v < 2**32, "an integer in [0, 2**32 - 1] (what NumPy can seed)"),
    "data_seed": (lambda v: 0 <= v < 2**32, "an integer in [0, 2**32 - 1], or None"),
    "num_train_epochs": (_finite_at_least(0), "a finite number >= 0"),
    "weight_decay": (math.isfinite, "a finite number"),
    "warmup_steps": (_finite_at_least(0), "a finite number >= 0 (a ratio below 1, or steps)"),
    "adam_beta1": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "adam_beta2": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "adam_epsilon": (_finite_at_least(0), "a finite number >= 0"),
    "label_smoothing_factor": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "dataloader_num_workers": (lambda v: v >= 0, "an integer >= 0"),
    "max_length": (lambda v: v >= 1, "an integer >= 1, or None"),
    "max_completion_length": (lambda v: v >= 1, "an integer >= 1"),
    "beta": (math.isfinite, "a finite number"),
    "temperature": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: v >= 0, "an integer >= 0 (0 turns top-k off)"),
    "num_iterations": (lambda v: v >= 1, "an integer >= 1"),
    "steps_per_generation": (lambda v: v >= 1, "an integer >= 1"),
}
# NaN is refused in every float field (it is nobody's setting); infinity only where bounded
# above: max_grad_norm=inf legitimately measures the gradient norm without clipping.

_TYPE_WORDS = {"bool": "True or False", "int": "an integer", "float": "a number",
               "float_list": "a list of numbers"}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):  # True is an int to Python, never a count or a rate here
        return False
    if kind == "int":
        return isinstance(value, numbers.Integral)
    if kind == "float":
        return isinstance(value, numbers.Real) and not math.isnan(value)
    return isinstance(value, (list, tuple)) and all(_is_kind(v, "float") for v in value)


def _example(name: str, kind: str, default: Any) -> str:
    if kind == "bool":
        return f"{name}=True or {name}=False"
    if default is not None and _is_kind(default, kind) and _within(name, default):
        return f"e.g. {name}={default!r}"
    return {"int": f"e.g. {name}=1", "float": f"e.g. {name}=0.1"}.get(kind, f"e.g. {name}=[1.0]")


def _within(name: str, value: Any) -> bool:
    bound = _BOUNDS.get(name)
    return bound is None or value is None or bound[0](value)


def _type_hint(value: Any, kind: str) -> str:
    """What the user probably meant, for the common slips."""
    if isinstance(value, str) and kind in ("int", "float"):
        try:
            float(value)
        except ValueError:
            return ""
        if re.fullmatch(r"[+-]?\d+[eE][+-]?\d+", value.strip()):
            return (f" ({value!r} is text: YAML reads a number with an exponent but no dot as a "
                    f"string; write {value.lower().replace('e', '.0e', 1)})")
        return f" ({value!r} is text: write the number without quotes)"
    if isinstance(value, float) and kind == "int" and value.is_integer():
        return f" (write {int(value)}, not {value!r})"
    if isinstance(value, Mapping):
        return " (to give candidates, write a List: {List: [...]} in YAML, List([...]) in Python)"
    return ""


def check_field_values(
    config_class: type, values: Mapping[str, Any], *, ranges: bool = True
) -> None:
    """Raise :class:`PreflightError` for a value of the wrong type (``"abc"`` as a learning
    rate, ``2.5`` as a seed, ``1`` as a flag) or, with ``ranges``, out of the range training
    needs (a batch size of 0, a negative learning rate), by the annotations of
    ``config_class`` (a TRL config class). Unknown names in ``values`` are ignored."""
    specs = _field_specs(config_class)
    for name, value in values.items():
        spec = specs.get(name)
        if spec is None or (value is None and spec[1]):
            continue
        kind, optional, default = spec
        if not _is_kind(value, kind):
            wanted = _TYPE_WORDS[kind] + (", or None" if optional else "")
            got = "not a number (NaN)" if isinstance(value, float) and math.isnan(value) else (
                _a(type(value).__name__))
            raise PreflightError(
                f"`{name}`={value!r} is {got}, but {name} takes {wanted}"
                f"{_type_hint(value, kind)}. Give {_example(name, kind, default)}."
            )
        if ranges and not _within(name, value):
            raise PreflightError(
                f"`{name}`={value!r} is out of range: {name} must be {_BOUNDS[name][1]}. "
                f"Give {_example(name, kind, default)}."
            )


# --------------------------------------------------------------------------------------------
# Trainer-level values
# --------------------------------------------------------------------------------------------


def _check_trainer_values(trainer_kwargs: Mapping[str, Any]) -> None:
    """The trainer arguments that may be knobs: a wrong kind of object there fails only when
    its run's trainer is built or first steps, while the other runs train."""
    def fail(name: str, value: Any, wanted: str) -> None:
        raise PreflightError(
            f"`{name}`={_short(value)} is {_a(type(value).__name__)}, but {name} takes {wanted}."
        )

    model = trainer_kwargs.get("model")
    if "model" in trainer_kwargs and not isinstance(model, (str, os.PathLike)) \
            and not callable(model):
        fail("model", model, "a model name or path, or a loaded model")
    peft_config = trainer_kwargs.get("peft_config")
    if peft_config is not None:
        from peft import PeftConfig

        if not isinstance(peft_config, PeftConfig):
            fail("peft_config", peft_config,
                 "a PEFT config such as LoraConfig(r=8, target_modules=[...]), or None")
    formatting_func = trainer_kwargs.get("formatting_func")
    if formatting_func is not None and not callable(formatting_func):
        fail("formatting_func", formatting_func, "a function of one example, or None")
    if trainer_kwargs.get("reward_funcs") is not None:
        # None is TRL's to judge: an environment may own the reward (its get_reward), and
        # without one TRL says "No reward source provided".
        funcs = trainer_kwargs["reward_funcs"]
        for func in funcs if isinstance(funcs, (list, tuple)) else [funcs]:
            if not (callable(func) or isinstance(func, str)):
                fail("reward_funcs", func, "reward functions (callables) or reward model names")
        if isinstance(funcs, (list, tuple)) and not funcs:
            raise PreflightError("`reward_funcs` is an empty list: give at least one function.")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"
