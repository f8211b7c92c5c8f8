"""The ``trl-rapidfire`` console script: the client's commands (:mod:`.client.cli`: status,
ops, dashboard, report; they never load torch or TRL) and those that load the training stack
(:mod:`.trainers.commands`: ``expand``). ``python -m trl_rapidfire.cli`` is the same."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .client.cli import main as client_main
from .trainers.commands import add_training_commands

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trl-rapidfire`` console script: run one command, return its exit
    code (2 and one line on stderr for a bad call, a bad file or an unusable store)."""
    return client_main(argv, extra=(add_training_commands,))


if __name__ == "__main__":
    sys.exit(main())
