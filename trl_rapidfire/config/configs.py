"""RF configs: TRL's configs (``SFTConfig``, ``DPOConfig``, ``GRPOConfig``, ``KTOConfig``,
``RewardConfig``, ``RLOOConfig``, ``DistillationConfig``) whose fields may be knobs.

An RF config is the user's *description of a config group*. It keeps exactly what the user
wrote (a field holding ``List([...])`` reads back as that ``List``; ``eval_strategy="chunk"``
reads back as ``"chunk"``) and builds, for each run the search picks, a *concrete* config: an
instance of the TRL parent class with every knob replaced by one value and every
trl-rapidfire-only setting translated into something TRL accepts (:mod:`.rf_config`).

Validation happens twice, both before any training: once when the RF config is built (the
parent's own ``__post_init__`` runs on the first candidate of every knob, so a plain typo
fails as it would in TRL), and once per run when the search builds each concrete config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from trl import (
    DistillationConfig,
    DPOConfig,
    GRPOConfig,
    KTOConfig,
    RewardConfig,
    RLOOConfig,
    SFTConfig,
)

from .errors import RFConfigError
from .fields import CHUNK
from .fsdp import is_gang_config, normalize_fsdp_config
from .generation import GenerationEvalFields
from .removed_options import DPO_REMOVED, GRPO_REMOVED, Removed
from .rf_config import RFConfigMixin, strategy_field

# RFConfigError, RFConfigMixin, is_gang_config and normalize_fsdp_config live in lower modules
# (so that those can raise and use them); this is where users import them from.
__all__ = [
    "RFConfigError",
    "RFConfigMixin",
    "RFSFTConfig",
    "RFDPOConfig",
    "RFGRPOConfig",
    "RFKTOConfig",
    "RFRewardConfig",
    "RFRLOOConfig",
    "RFDistillationConfig",
    "CHUNK",
    "is_gang_config",
    "normalize_fsdp_config",
]


# --------------------------------------------------------------------------------------------
# The public configs, one per TRL trainer kind
# --------------------------------------------------------------------------------------------


@dataclass
class RFSFTConfig(RFConfigMixin, GenerationEvalFields, SFTConfig):
    """TRL's :class:`~trl.SFTConfig` whose fields may hold :class:`List` or :class:`Range` knobs.

    Adds ``num_chunks`` and accepts ``eval_strategy="chunk"`` / ``save_strategy="chunk"``
    (evaluate / checkpoint every run at every chunk end); ``generation_config`` judges runs
    by what they generate (see ``docs/evaluation.md``). Without knobs it behaves as
    ``SFTConfig``: same defaults, same validation errors.

    Example::

        RFSFTConfig(output_dir="out", learning_rate=List([2e-4, 1e-5]),
                    lr_scheduler_type=List(["linear", "cosine"]), num_chunks=4)
    """

    trl_config_class: ClassVar[type] = SFTConfig
    eval_strategy: str = strategy_field(SFTConfig, "eval_strategy")
    save_strategy: str = strategy_field(SFTConfig, "save_strategy")


@dataclass
class RFDPOConfig(RFConfigMixin, GenerationEvalFields, DPOConfig):
    """TRL's :class:`~trl.DPOConfig` whose fields may hold knobs (see :class:`RFSFTConfig`).

    Options TRL 1.x removed (``max_prompt_length``, ``max_completion_length``,
    ``model_adapter_name``, ``ref_adapter_name``, ``force_use_ref_model``) are accepted only
    with the value TRL now uses anyway; any other value is an error naming the replacement.
    """

    trl_config_class: ClassVar[type] = DPOConfig
    _removed_options: ClassVar[dict[str, Removed]] = DPO_REMOVED
    eval_strategy: str = strategy_field(DPOConfig, "eval_strategy")
    save_strategy: str = strategy_field(DPOConfig, "save_strategy")
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Removed in TRL 1.x; use max_length."}
    )
    max_completion_length: int | None = field(
        default=None, metadata={"help": "Removed in TRL 1.x; use max_length."}
    )
    model_adapter_name: str | None = field(
        default=None, metadata={"help": "Removed in TRL 1.x: the active adapter is trained."}
    )
    ref_adapter_name: str | None = field(
        default=None,
        metadata={"help": "Removed in TRL 1.x: the reference is the base model, adapter disabled."},
    )
    force_use_ref_model: bool | None = field(
        default=None, metadata={"help": "Removed in TRL 1.x: pass ref_model= to the trainer."}
    )


@dataclass
class RFGRPOConfig(RFConfigMixin, GRPOConfig):
    """TRL's :class:`~trl.GRPOConfig` whose fields may hold knobs (see :class:`RFSFTConfig`).

    ``reward_weights`` may be a knob, usually zipped with the trainer-level ``reward_funcs``:
    ``GridSearch(zip=[("reward_funcs", "reward_weights")])``. The removed ``max_prompt_length``
    is an error naming what replaced it.
    """

    trl_config_class: ClassVar[type] = GRPOConfig
    _removed_options: ClassVar[dict[str, Removed]] = GRPO_REMOVED
    eval_strategy: str = strategy_field(GRPOConfig, "eval_strategy")
    save_strategy: str = strategy_field(GRPOConfig, "save_strategy")
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Removed in TRL 1.x: prompts are not truncated."}
    )


@dataclass
class RFKTOConfig(RFConfigMixin, GenerationEvalFields, KTOConfig):
    """TRL's :class:`~trl.KTOConfig` whose fields may hold knobs (see :class:`RFSFTConfig`):
    ``beta``, ``desirable_weight`` and ``undesirable_weight`` are the usual ones to compare."""

    trl_config_class: ClassVar[type] = KTOConfig
    eval_strategy: str = strategy_field(KTOConfig, "eval_strategy")
    save_strategy: str = strategy_field(KTOConfig, "save_strategy")


@dataclass
class RFRewardConfig(RFConfigMixin, RewardConfig):
    """TRL's :class:`~trl.RewardConfig` whose fields may hold knobs (see :class:`RFSFTConfig`),
    e.g. ``center_rewards_coefficient=List([None, 0.01])``. Its runs are judged best by
    ``eval_loss`` unless ``metric_for_best_model="eval_accuracy"`` (and
    ``greater_is_better=True``) says otherwise."""

    trl_config_class: ClassVar[type] = RewardConfig
    eval_strategy: str = strategy_field(RewardConfig, "eval_strategy")
    save_strategy: str = strategy_field(RewardConfig, "save_strategy")


@dataclass
class RFRLOOConfig(RFConfigMixin, RLOOConfig):
    """TRL's :class:`~trl.RLOOConfig` whose fields may hold knobs (see :class:`RFSFTConfig`);
    ``reward_weights`` and ``num_generations`` may be knobs, as in :class:`RFGRPOConfig`."""

    trl_config_class: ClassVar[type] = RLOOConfig
    eval_strategy: str = strategy_field(RLOOConfig, "eval_strategy")
    save_strategy: str = strategy_field(RLOOConfig, "save_strategy")


@dataclass
class RFDistillationConfig(RFConfigMixin, DistillationConfig):
    """TRL's :class:`~trl.DistillationConfig` whose fields may hold knobs (see
    :class:`RFSFTConfig`): ``beta``, ``temperature`` and the student's own hyperparameters;
    the teacher is the trainer's ``teacher_model`` argument (a knob there too)."""

    trl_config_class: ClassVar[type] = DistillationConfig
    eval_strategy: str = strategy_field(DistillationConfig, "eval_strategy")
    save_strategy: str = strategy_field(DistillationConfig, "save_strategy")
