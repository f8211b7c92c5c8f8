"""What every ``RF*Trainer``'s constructor does with the arguments of its TRL trainer: the
arguments kept for the runs, the experiment's RF config (from whatever TRL accepts as
``args``), and the checks that can be made before any model loads.

Each kind's constructor keeps its TRL trainer's signature (a drop-in) and hands it here::

    arguments = trainer_arguments(locals())  # first: nothing else in locals() yet
    self._rf_setup(args=experiment_config(arguments, args, RFKTOConfig, "KTO",
                                          each_dataset(check_kto_dataset)), ...)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config.configs import RFConfigError, RFConfigMixin
from ..config.dataset_checks import check_dataset_rows
from ..config.preflight import PreflightError

__all__ = ["default_output_dir", "each_dataset", "experiment_config", "rf_config_from",
           "trainer_arguments"]

DatasetCheck = Callable[[dict[str, Any]], None]


def experiment_config(arguments: dict[str, Any], args: Any, config_class: type[RFConfigMixin],
                      suffix: str, check: DatasetCheck | None = None) -> Any:
    """The experiment's config, once the datasets in ``arguments`` passed ``check`` (default:
    each has rows), before any model loads. ``suffix``: TRL's default ``output_dir`` ends with
    it (``SFT``, ``DPO``, ...). Raises TRL's ``ValueError`` without a ``train_dataset`` and
    :class:`RFConfigError` for a dataset the kind cannot read."""
    if arguments.get("train_dataset") is None:
        raise ValueError("`train_dataset` is required")
    try:
        if check is None:
            check_dataset_rows({k: arguments.get(k) for k in ("train_dataset", "eval_dataset")})
        else:
            check(arguments)
    except PreflightError as err:
        raise RFConfigError(str(err)) from None
    return rf_config_from(args, config_class, default_output_dir(arguments.get("model"), suffix))


def each_dataset(check: Callable[..., None], **options: Any) -> DatasetCheck:
    """A check of the train and the eval dataset by ``check(dataset, label=..., **options)``
    (a kind's columns, which do not depend on its config)."""
    def run(arguments: dict[str, Any]) -> None:
        for label in ("train_dataset", "eval_dataset"):
            check(arguments.get(label), label=label, **options)

    return run


def rf_config_from(args: Any, config_class: type[RFConfigMixin],
                   default_output_dir: str) -> Any:
    """Accept what the TRL trainer accepts as ``args``: an RF config, the TRL config, plain
    ``TrainingArguments`` (converted), or ``None`` (defaults)."""
    if args is None:
        # An RF config class is a dataclass of the mixin and a TRL config: TRL's fields.
        return config_class(output_dir=default_output_dir)  # type: ignore[call-arg]
    if isinstance(args, RFConfigMixin):
        return args
    if isinstance(args, config_class.trl_config_class):  # a plain TRL config: one run, one chunk
        return args
    dict_args = args.to_dict()
    dict_args["hub_token"] = args.hub_token
    return config_class(**dict_args)


def default_output_dir(model: Any, suffix: str) -> str:
    """TRL's default ``output_dir``: the model's name, then ``-<suffix>`` (``SFT``, ...)."""
    name = model if isinstance(model, str) else getattr(
        getattr(model, "config", None), "name_or_path", "model"
    )
    return f"{str(name).rstrip('/').split('/')[-1]}-{suffix}"


def trainer_arguments(given: dict[str, Any]) -> dict[str, Any]:
    """An RF trainer's ``__init__`` arguments that its TRL trainer takes, from the
    ``locals()`` of its first line (``args``, ``search`` and ``policy`` are the experiment's)."""
    return {k: v for k, v in given.items()
            if k not in ("self", "args", "search", "policy", "__class__")}
