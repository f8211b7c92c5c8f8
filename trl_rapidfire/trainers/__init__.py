"""The RF trainers: drop-in subclasses of TRL's trainers that train many configs at once.

Each loads on first use (TRL's stack takes seconds to import): the command line imports
:mod:`.commands` from here without loading any trainer.
"""

_TRAINERS = {"RFDPOTrainer": "dpo", "RFGRPOTrainer": "grpo", "RFSFTTrainer": "sft"}


def __getattr__(name: str):
    import importlib

    if name in _TRAINERS:
        value = getattr(importlib.import_module(f".{_TRAINERS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RFDPOTrainer", "RFGRPOTrainer", "RFSFTTrainer"]
