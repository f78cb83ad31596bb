"""``deepspec train recipe=NAME [overrides]``: the same as ``python train.py``."""

from __future__ import annotations

import argparse

from deepspec_train.jobs.entry import main


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs="*", help="recipe=NAME followed by dotted.key=value overrides")


def run(args: argparse.Namespace) -> int:
    return main(args.args)
