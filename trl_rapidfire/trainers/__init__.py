"""The RF trainers: drop-in subclasses of TRL's trainers that train many configs at once."""

from .sft import RFSFTTrainer

__all__ = ["RFSFTTrainer"]
