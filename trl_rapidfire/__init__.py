"""trl-rapidfire: hyperparallel TRL fine-tuning.

Compare many training configurations at once on the same GPU(s): turn knobs of an
``RFSFTConfig`` / ``RFDPOConfig`` / ``RFGRPOConfig`` into ``List([...])`` or ``Range(lo, hi)``
and the search expands them into runs.
"""

__version__ = "0.1.0"

# Everything loads on first use: the configs import TRL's stack (seconds), which the CLI's
# control commands (`trl-rapidfire stop run-1`) never need.
_LAZY = {
    "RFSFTConfig": "config.configs", "RFDPOConfig": "config.configs",
    "RFGRPOConfig": "config.configs", "RFConfigError": "config.configs",
    "KnobError": "config.knobs", "List": "config.knobs", "Range": "config.knobs",
    "Budget": "control.policies", "PopulationBased": "control.policies",
    "SuccessiveHalving": "control.policies", "Hyperband": "control.policies",
    "GridSearch": "search.searches", "RandomSearch": "search.searches",
    "RunSpec": "search.searches", "SearchError": "search.searches",
    "ExperimentFault": "storage.faults",
    "OptunaSearch": "integrations.optuna.search", "OptunaPruner": "integrations.optuna.pruner",
    "RFSFTTrainer": "trainers.sft", "RFDPOTrainer": "trainers.dpo",
    "RFGRPOTrainer": "trainers.grpo",
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
    "__version__",
]
