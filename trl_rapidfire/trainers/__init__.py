"""The RF trainers: drop-in subclasses of TRL's trainers that train many configs at once."""

from .dpo import RFDPOTrainer
from .grpo import RFGRPOTrainer
from .sft import RFSFTTrainer

__all__ = ["RFDPOTrainer", "RFGRPOTrainer", "RFSFTTrainer"]
