"""trl-rapidfire: hyperparallel TRL fine-tuning.

Compare many training configurations at once on the same GPU(s): turn knobs of an RF config
(``RFSFTConfig``, ``RFDPOConfig``, ``RFGRPOConfig``, ``RFKTOConfig``, ``RFRewardConfig``,
``RFRLOOConfig``, ``RFDistillationConfig``) into ``List([...])`` or ``Range(lo, hi)`` and the
search expands them into runs.
"""

__version__ = "0.1.0"

TRAINER_KINDS = ("SFT", "DPO", "GRPO", "KTO", "Reward", "RLOO", "Distillation")
"""TRL's trainers that have an RF pair: ``RF<kind>Config`` and ``RF<kind>Trainer``."""

# Everything loads on first use: the configs import TRL's stack (seconds), which the CLI's
# control commands (`trl-rapidfire stop run-1`) never need.
_LAZY = {
    **{f"RF{kind}Config": "config.configs" for kind in TRAINER_KINDS},
    "RFConfigError": "config.configs",
    "KnobError": "config.knobs", "List": "config.knobs", "Range": "config.knobs",
    "Budget": "control.policies", "PopulationBased": "control.policies",
    "SuccessiveHalving": "control.policies", "Hyperband": "control.policies",
    "GridSearch": "search.searches", "RandomSearch": "search.searches",
    "RunSpec": "search.searches", "SearchError": "search.searches",
    "ExperimentFault": "storage.faults",
    "OptunaSearch": "integrations.optuna.search", "OptunaPruner": "integrations.optuna.pruner",
    **{f"RF{kind}Trainer": f"trainers.{kind.lower()}" for kind in TRAINER_KINDS},
    "RunResult": "reports.results", "ChunkRecord": "storage.schedule",
}  # fmt: skip


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "RFSFTConfig",
    "RFDPOConfig",
    "RFGRPOConfig",
    "RFSFTTrainer",
    "RFDPOTrainer",
    "RFGRPOTrainer",
    "RFKTOConfig",
    "RFKTOTrainer",
    "RFRewardConfig",
    "RFRewardTrainer",
    "RFRLOOConfig",
    "RFRLOOTrainer",
    "RFDistillationConfig",
    "RFDistillationTrainer",
    "RunResult",
    "ChunkRecord",
    "List",
    "Range",
    "GridSearch",
    "RandomSearch",
    "OptunaSearch",
    "RunSpec",
    "SuccessiveHalving",
    "Hyperband",
    "PopulationBased",
    "Budget",
    "OptunaPruner",
    "KnobError",
    "RFConfigError",
    "SearchError",
    "ExperimentFault",
    "TRAINER_KINDS",
    "__version__",
]
