"""``deepspec export``: write a trained drafter as safetensors + config.json in a serving layout.

    deepspec export --drafter runs/tiny-dspark/drafter --target tinyworld/target --out exports/dspark \\
        [--layout dspark|zlab-dflash|eagle3] [--dtype bf16|fp32] [--calibration calib/calibration.json] \\
        [--engines vllm,sglang] [--sps sps.sglang.json]

The layout defaults to the drafter's own (see ``deepspec_train.export.exporter``). ``--calibration`` takes the
``calibration.json`` written by ``deepspec calibrate`` (or the ``sglang_sts.json`` beside it): the temperatures go
into the DSpark config.json (read by this project's loader and evaluator) and the STS file is copied next to the
export (SGLang's only source of calibration). The export is checked against each engine's rules
(``engine_rules``) and against the target the drafter was trained for before anything is written: an engine
that would capture other target layers than the drafter was trained on, a tensor an engine refuses, a field it
needs that is missing, or another target is refused (exit status 2, a ``UserError``: one line listing every
problem, nothing written). ``--engines`` narrows the check (default: every engine that serves the layout). On
success the command prints, per engine, the target layers it will capture and the serve command lines (``--sps``
names the SGLang SPS table written by ``deepspec profile-sps`` in them).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from deepspec_train.common.errors import UserError
from deepspec_train.common.output_paths import check_output_dir, ensure_output_dir
from deepspec_train.export.engine_files import STS_FILENAME, read_sts
from deepspec_train.export.engine_rules import check_export_dir, describe
from deepspec_train.export.exporter import DTYPES, export_drafter
from deepspec_train.serving_layouts.engine_reading import ENGINES
from deepspec_train.serving_layouts.layout_registry import LAYOUTS
from deepspec_train.common.model_folders import check_drafter_folder, check_target_folder


def _engine_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"--engines takes a comma-separated subset of {list(ENGINES)}, got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drafter", required=True, help="training output <run>/drafter, or an earlier export")
    parser.add_argument("--target", required=True, help="target model directory (config.json + safetensors)")
    parser.add_argument("--out", required=True, help="export directory to write")
    parser.add_argument("--layout", choices=tuple(LAYOUTS), default=None, help="default: the drafter's own layout")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="float dtype of the weights")
    parser.add_argument("--calibration", default=None,
                        help=f"calibration.json (or {STS_FILENAME}) from `deepspec calibrate`")
    parser.add_argument("--engines", type=_engine_list, default=None,
                        help="engines the export must be read right by (default: every engine serving the layout)")
    parser.add_argument("--sps", default=None, help="SGLang SPS table from `deepspec profile-sps`, for the serve line")


def sts_file_for(calibration: str) -> Path:
    """The STS file of a calibration: the path itself when it is one, else the ``sglang_sts.json`` beside it."""
    path = Path(calibration)
    if path.name == STS_FILENAME:
        return path
    sibling = path.with_name(STS_FILENAME)
    if not sibling.is_file():
        raise FileNotFoundError(f"{path}: no {STS_FILENAME} beside it; run `deepspec calibrate` again to write it")
    return sibling


def run(args: argparse.Namespace) -> int:
    # The folder is made (and proven writable) before any work; a refused export takes it away again when it was
    # ours and is still empty, so a refusal leaves nothing behind.
    # The output folder is proven writable first, then the drafter and target folders are checked (headers only),
    # before the folder is made.
    check_output_dir(args.out, "--out")
    check_drafter_folder(args.drafter, "--drafter")
    check_target_folder(args.target, "--target")
    created = not os.path.exists(args.out)
    ensure_output_dir(args.out, "--out")
    temperatures, sts = None, None
    try:
        if args.calibration:
            sts = sts_file_for(args.calibration)
            temperatures = read_sts(sts)["temperatures"]
        out = export_drafter(args.drafter, args.target, args.out, args.layout, temperatures, DTYPES[args.dtype],
                             args.engines, sts)
        readings = check_export_dir(out, args.target, args.engines, args.sps)
    # LayoutError and EngineRuleError are ValueErrors: a refused export lands here with every problem listed.
    except (ValueError, OSError, KeyError) as err:
        if created and not any(Path(args.out).iterdir()):
            Path(args.out).rmdir()
        raise UserError(f"export refused: {err}") from err
    config = json.loads((out / "config.json").read_text())
    print(f"exported {config['architectures'][0]} ({args.dtype}) to {out}")
    if "confidence_temperatures" in config:
        print("confidence temperatures: " + " ".join(f"{t:.3f}" for t in config["confidence_temperatures"]))
    if sts is not None:
        print(f"SGLang STS file: {out / STS_FILENAME}")
    for reading in readings:
        print("\n".join(describe(reading)))
    return 0
