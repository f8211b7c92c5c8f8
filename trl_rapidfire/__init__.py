"""trl-rapidfire: hyperparallel TRL fine-tuning.

Compare many training configurations at once on the same GPU(s): turn knobs of an
``RFSFTConfig`` / ``RFDPOConfig`` / ``RFGRPOConfig`` into ``List([...])`` or ``Range(lo, hi)``
and the search expands them into runs.
"""

from .configs import RFConfigError, RFDPOConfig, RFGRPOConfig, RFSFTConfig
from .knobs import KnobError, List, Range
from .search import GridSearch, RandomSearch, RunSpec, SearchError

__version__ = "0.1.0"

__all__ = [
    "RFSFTConfig",
    "RFDPOConfig",
    "RFGRPOConfig",
    "List",
    "Range",
    "GridSearch",
    "RandomSearch",
    "RunSpec",
    "KnobError",
    "RFConfigError",
    "SearchError",
    "__version__",
]
