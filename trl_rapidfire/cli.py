"""The ``trl-rapidfire`` command line.

Commands:
  version                 print the versions of trl-rapidfire and the stack under it
  expand CONFIG.yaml      print the runs a YAML config group expands into (nothing is trained)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__


def _cmd_version(_: argparse.Namespace) -> int:
    import importlib.metadata as md

    print(f"trl-rapidfire {__version__}")
    for dist in ("trl", "transformers", "peft", "torch", "accelerate", "datasets", "mlflow"):
        try:
            print(f"  {dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            print(f"  {dist} (not installed)")
    return 0


def _cmd_expand(args: argparse.Namespace) -> int:
    from trl import TrlParser

    from .configs import RFDPOConfig, RFGRPOConfig, RFSFTConfig
    from .display import table
    from .search import GridSearch, RandomSearch

    config_class = {"sft": RFSFTConfig, "dpo": RFDPOConfig, "grpo": RFGRPOConfig}[args.trainer]
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-rapidfire",
        description="Hyperparallel TRL fine-tuning: compare many configs at once, chunk by chunk.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("version", help="print the versions of trl-rapidfire and its stack")
    p.set_defaults(func=_cmd_version)
    p = sub.add_parser(
        "expand",
        help="print the runs a YAML config group expands into (nothing is trained)",
        description="Parse CONFIG (TrlParser YAML; knobs as {List: [...]} or "
        "{Range: {low: .., high: .., log: true}}) and print its runs. Extra --flags override "
        "the YAML, as with TRL scripts.",
    )
    p.add_argument("config", help="YAML file of RF config fields")
    p.add_argument("--trainer", choices=["sft", "dpo", "grpo"], default="sft")
    p.add_argument("--search", choices=["grid", "random"], default="grid")
    p.add_argument("--num-runs", type=int, default=8, help="draws for --search random")
    p.add_argument("--seed", type=int, default=0, help="seed for --search random")
    p.set_defaults(func=_cmd_expand)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trl-rapidfire`` console script."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "command", None) is None:
        parser.print_help()
        return 0
    if rest and args.command != "expand":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.overrides = rest
    try:
        return args.func(args)
    except ValueError as err:
        print(f"trl-rapidfire {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
