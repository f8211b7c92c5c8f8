"""trl-rapidfire: hyperparallel TRL fine-tuning.

Compare many training configurations at once on the same GPU(s): turn knobs of an
``RFSFTConfig`` / ``RFDPOConfig`` / ``RFGRPOConfig`` into ``List([...])`` or ``Range(lo, hi)``
and the search expands them into runs.
"""

from .configs import RFConfigError, RFDPOConfig, RFGRPOConfig, RFSFTConfig
from .faults import ExperimentFault
from .knobs import KnobError, List, Range
from .policies import Budget, PopulationBased, SuccessiveHalving
from .search import GridSearch, RandomSearch, RunSpec, SearchError

__version__ = "0.1.0"

_LAZY = {
    "RFSFTTrainer": "trainers",
    "RFDPOTrainer": "trainers",
    "RFGRPOTrainer": "trainers",
    "RunResult": "results",
    "ChunkRecord": "schedule",
}


def __getattr__(name: str):
    # The trainers import TRL's trainer stack (seconds); configs and knobs do not need it.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "RunSpec",
    "SuccessiveHalving",
    "PopulationBased",
    "Budget",
    "KnobError",
    "RFConfigError",
    "SearchError",
    "ExperimentFault",
    "__version__",
]
