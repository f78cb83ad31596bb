"""The ``deepspec tinyworld build`` verb.

    deepspec tinyworld build --out DIR [--preset test|small] [--seed N]
    python -m deepspec_train.tinyworld.cli build --out DIR --preset test

The lead's console script creates the ``tinyworld`` subparser and calls ``add_arguments`` / ``run``.
"""

from __future__ import annotations

import argparse
import sys

from deepspec_train.errors import UserError, run_verb
from deepspec_train.output_paths import ensure_output_dir
from deepspec_train.tinyworld.presets import PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``build`` sub-command (and its options) to the ``tinyworld`` parser."""
    commands = parser.add_subparsers(dest="tinyworld_command", required=True)
    build = commands.add_parser("build", help="build a tiny world: corpus, tokenizer, target, regenerated data")
    build.add_argument("--out", required=True, help="output directory")
    build.add_argument("--preset", choices=sorted(PRESETS), default="small", help="size preset (default: small)")
    build.add_argument("--seed", type=int, default=0, help="seed of the corpus, the training and the sampling")
    build.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    build.add_argument("--force", action="store_true", help="replace a tiny world already in --out")
    build.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``tinyworld`` sub-command; returns the process exit status."""
    # Imported here so that `deepspec --help` does not pay for torch and transformers.
    import torch

    from deepspec_train.tinyworld.build import build_tiny_world, format_loss_table
    from deepspec_train.tinyworld.presets import get_preset

    torch.set_num_threads(args.threads)
    ensure_output_dir(args.out, "--out")
    try:
        report = build_tiny_world(
            args.out, get_preset(args.preset), seed=args.seed, progress=not args.no_progress, overwrite=args.force
        )
    except FileExistsError as exc:
        raise UserError(str(exc)) from exc
    training = report["training"]
    print(format_loss_table(report["heldout_loss"], report["unigram_entropy"]))
    print(
        f"target: {report['num_parameters']:,} parameters, {training['tokens']:,} training tokens at "
        f"{training['tokens_per_s']:,.0f} tok/s{' (stopped by the time limit)' if training['stopped_by_time'] else ''}"
    )
    timings = ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in report["timings"].items())
    print(f"times: {timings}")
    print(f"mask_token_id {report['mask_token_id']}; tiny world written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_verb("deepspec tinyworld", __doc__.splitlines()[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
