"""The ``deepspec tinyworld build`` verb.

    deepspec tinyworld build --out DIR [--preset test|small] [--seed N] [--max-train-seconds S]
    python -m deepspec_train.tinyworld.cli build --out DIR --preset test

The lead's console script creates the ``tinyworld`` subparser and calls ``add_arguments`` / ``run``.
"""

from __future__ import annotations

import argparse
import os
import sys

from deepspec_train.common.errors import UserError, run_verb
from deepspec_train.common.output_paths import ensure_output_dir
from deepspec_train.tinyworld.presets import PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``build`` sub-command (and its options) to the ``tinyworld`` parser."""
    commands = parser.add_subparsers(dest="tinyworld_command", required=True)
    build = commands.add_parser("build", help="build a tiny world: corpus, tokenizer, target, regenerated data")
    build.add_argument("--out", required=True, help="output directory")
    build.add_argument("--preset", choices=sorted(PRESETS), default="small", help="size preset (default: small)")
    build.add_argument("--seed", type=int, default=0, help="seed of the corpus, the training and the sampling")
    build.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    build.add_argument(
        "--max-train-seconds",
        type=float,
        help="cap the target's training time (default: none, every step of the preset runs, so the world is the "
        "same on an idle and a busy machine; with a cap it depends on the machine's speed and load)",
    )
    build.add_argument("--force", action="store_true", help="replace a tiny world already in --out")
    build.add_argument("--no-progress", action="store_true", help="hide the phase lines and progress bars")


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``tinyworld`` sub-command; returns the process exit status."""
    # Idle OpenMP threads spin by default, and on a machine shared with other jobs two spinning threads made the
    # `test` preset's target training 20x slower (123 s against 6 s passive). OpenMP reads the policy when torch
    # loads it, hence before the import; a policy the user set wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Imported here so that `deepspec --help` does not pay for torch and transformers.
    import torch
    from transformers.utils import logging as hf_logging

    from deepspec_train.tinyworld.build import build_tiny_world, format_loss_table
    from deepspec_train.tinyworld.presets import get_preset

    if args.max_train_seconds is not None and args.max_train_seconds <= 0:
        raise UserError(f"--max-train-seconds must be positive, got {args.max_train_seconds:g}")
    torch.set_num_threads(args.threads)
    if args.no_progress:
        hf_logging.disable_progress_bar()  # transformers' weight saving and loading bars too
    ensure_output_dir(args.out, "--out")
    try:
        report = build_tiny_world(
            args.out,
            get_preset(args.preset),
            seed=args.seed,
            progress=not args.no_progress,
            overwrite=args.force,
            max_train_seconds=args.max_train_seconds,
        )
    except FileExistsError as exc:
        raise UserError(str(exc)) from exc
    training = report["training"]
    print(format_loss_table(report["heldout_loss"], report["unigram_entropy"]))
    cap = f" (--max-train-seconds {training['max_train_seconds']:g})" if training["max_train_seconds"] else ""
    print(
        f"target: {report['num_parameters']:,} parameters, {training['steps']} of {training['preset_steps']} "
        f"steps{cap}, {training['tokens']:,} training tokens at {training['tokens_per_s']:,.0f} tok/s"
    )
    timings = ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in report["timings"].items())
    print(f"times: {timings}")
    print(f"mask_token_id {report['mask_token_id']}; tiny world written to {args.out}")
    for warning in report["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_verb("deepspec tinyworld", __doc__.splitlines()[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
