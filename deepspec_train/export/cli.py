"""``deepspec export``: write a trained drafter as safetensors + config.json in a serving layout.

    deepspec export --drafter runs/tiny-dspark/drafter --target tinyworld/target --out exports/dspark \\
        [--layout dspark|zlab-dflash|eagle3] [--dtype bf16|fp32] [--calibration calib/calibration.json]

The layout defaults to the drafter's own (see ``deepspec_train.export.exporter``); ``--calibration`` takes the
``calibration.json`` written by ``deepspec calibrate`` and stores its temperatures in a DSpark export. An export
that would miss a required field or tensor is refused with one line (exit status 2, a ``UserError``) and nothing
is written.
"""

from __future__ import annotations

import argparse
import json

from deepspec_train.errors import UserError
from deepspec_train.export.exporter import DTYPES, export_drafter
from deepspec_train.export.layouts import LAYOUTS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drafter", required=True, help="training output <run>/drafter, or an earlier export")
    parser.add_argument("--target", required=True, help="target model directory (config.json + safetensors)")
    parser.add_argument("--out", required=True, help="export directory to write")
    parser.add_argument("--layout", choices=LAYOUTS, default=None, help="default: the drafter's own layout")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="float dtype of the weights")
    parser.add_argument("--calibration", default=None, help="calibration.json from `deepspec calibrate`")


def run(args: argparse.Namespace) -> int:
    temperatures = None
    if args.calibration:
        try:
            with open(args.calibration) as f:
                temperatures = json.load(f)["temperatures"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(f"--calibration {args.calibration}: not a calibration.json ({err!r})") from err
    try:
        out = export_drafter(args.drafter, args.target, args.out, args.layout, temperatures, DTYPES[args.dtype])
    # LayoutError is a ValueError: a refused export lands here with every problem listed.
    except (ValueError, OSError, KeyError) as err:
        raise UserError(f"export refused: {err}") from err
    config = json.loads((out / "config.json").read_text())
    print(f"exported {config['architectures'][0]} ({args.dtype}) to {out}")
    if "confidence_temperatures" in config:
        print("confidence temperatures: " + " ".join(f"{t:.3f}" for t in config["confidence_temperatures"]))
    return 0
