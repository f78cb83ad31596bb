"""``deepspec train recipe=NAME [overrides] [--dry-run]``: the same as ``python train.py``."""

from __future__ import annotations

import argparse

from deepspec_train.commands.train_entry import DRY_RUN, main


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(DRY_RUN, action="store_true",
                        help="check the recipe, the target and the data's first rows as a run does, print the "
                        "resolved config (YAML) and what was found; train nothing; exit 0 only when a run would start")
    # Everything after the first word goes to train.py's own parser, which also reads --dry-run and --help there.
    parser.add_argument("args", nargs=argparse.REMAINDER, help="recipe=NAME, then dotted.key=value overrides")


def run(args: argparse.Namespace) -> int:
    return main(args.args + ([DRY_RUN] if args.dry_run else []))
