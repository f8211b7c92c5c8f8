"""The commands of the ``trl-rapidfire`` command line that load the training stack.

``expand CONFIG.yaml`` parses a YAML config group the way a TRL script does (``TrlParser``,
with the RF config classes) and prints the runs it expands into; nothing is trained.
"""

from __future__ import annotations

import argparse

from .. import TRAINER_KINDS

__all__ = ["KINDS", "add_training_commands"]

# The trainer kinds by their command-line names (sft, ..., distillation).
KINDS = {kind.lower(): kind for kind in TRAINER_KINDS}


def _cmd_expand(args: argparse.Namespace) -> int:
    from trl import TrlParser

    from ..config import configs
    from ..reports.display import table
    from ..search.searches import GridSearch, RandomSearch

    config_class = getattr(configs, f"RF{KINDS[args.trainer]}Config")
    parser = TrlParser(dataclass_types=[config_class])
    (config,) = parser.parse_args_and_config(["--config", args.config, *args.overrides])
    search = (
        RandomSearch(args.num_runs, seed=args.seed) if args.search == "random" else GridSearch()
    )
    runs = search.expand(config)
    print(f"{len(runs)} run(s) from {args.config} with {search!r}, "
          f"{config.num_chunks} chunk(s) per epoch:")
    print(table(["run", "knobs"], [(r.name, r.describe()) for r in runs]))
    return 0


def add_training_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``expand`` to the command line's subparsers."""
    p = sub.add_parser(
        "expand",
        help="print the runs a YAML config group expands into (nothing is trained)",
        description="Parse CONFIG (TrlParser YAML; knobs as {List: [...]} or "
        "{Range: {low: .., high: .., log: true}}) and print its runs. Extra --flags override "
        "the YAML, as with TRL scripts.",
    )
    p.add_argument("config", help="YAML file of RF config fields")
    p.add_argument("--trainer", choices=list(KINDS), default="sft",
                   help="whose config the YAML holds (default sft)")
    p.add_argument("--search", choices=["grid", "random"], default="grid")
    p.add_argument("--num-runs", type=int, default=8, help="draws for --search random")
    p.add_argument("--seed", type=int, default=0, help="seed for --search random")
    # Unknown --flags are the YAML's overrides, as with TRL scripts.
    p.set_defaults(func=_cmd_expand, takes_overrides=True)
