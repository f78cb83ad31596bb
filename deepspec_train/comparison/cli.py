"""``deepspec compare``: one table, plots and (optionally) a W&B run comparing several trained drafters.

    deepspec compare runs/dspark runs/dflash runs/eagle3/eval/results.json --out reports/cmp \\
        [--label dspark --label dflash --label eagle3] [--wandb] [--wandb-project deepspec] [--wandb-group qwen3-8b]

Each argument is a run directory or a ``deepspec eval`` results file (see ``comparison.collect``), named in
tables and plots by the folder given, or by ``--label`` (one per argument, in order). The command writes
``OUT/comparison.md`` (main table ``drafter | kind | tau <suite>... | E[L] | ECE before | ECE after``,
conditional acceptance per position per suite, teacher-forced acceptance, calibration detail), the PNGs of
``comparison.plots.write_plots`` that the inputs have data for (``OUT/conditional_acceptance_<suite>.png``,
``OUT/tau_per_suite.png``, ``OUT/calibration.png``, ``OUT/validation_acceptance.png`` for training runs), and
prints the main table. With ``--wandb`` it also logs one W&B run (offline unless ``WANDB_MODE`` says otherwise; files
under ``WANDB_DIR`` or ``OUT``) holding the same tables, a line plot of acceptance per suite and the PNGs. The
run joins the group ``--wandb-group``, so that comparisons of the same drafters line up in the W&B UI.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from deepspec_train.comparison.collect import DrafterRow, collect_rows, suites_of
from deepspec_train.comparison.plots import write_plots
from deepspec_train.comparison.report import calibration_table, main_table, markdown_table, write_report
from deepspec_train.common.errors import UserError
from deepspec_train.common.output_paths import ensure_output_dir

DEFAULT_GROUP = "deepspec-compare"
# W&B truncates longer run names; a readable prefix of the drafter list is enough to recognise the run.
_MAX_RUN_NAME = 120


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="RUN_OR_RESULT", help="run directory or eval results.json")
    parser.add_argument("--out", required=True, help="directory for comparison.md and the PNG plots")
    parser.add_argument("--label", action="append", metavar="NAME",
                        help="name of each run in tables and plots, once per RUN_OR_RESULT in order "
                             "(default: the folder given)")
    parser.add_argument("--wandb", action="store_true", help="also log the tables and plots to a W&B run")
    parser.add_argument("--wandb-project", default="deepspec", help="W&B project (default: deepspec)")
    parser.add_argument("--wandb-group", default=DEFAULT_GROUP, help=f"W&B run group (default: {DEFAULT_GROUP})")


def acceptance_long_rows(rows: Sequence[DrafterRow]) -> list[list[Any]]:
    """``[drafter, suite, k, P(A_k | A_<k)]`` for every measured position: one tidy table for W&B charts."""
    return [
        [row.name, suite, k, value]
        for row in rows
        for suite, curve in row.conditional_acceptance.items()
        for k, value in enumerate(curve, 1)
        if value is not None
    ]


def log_to_wandb(
    rows: Sequence[DrafterRow], plot_files: Sequence[Path], project: str, group: str, out_dir: Path
) -> Path:
    """Log the comparison as one W&B run in ``group``; returns the run's local directory."""
    # Imported here: wandb and the sink (which pulls in torch.distributed) are only needed with --wandb.
    import wandb

    from deepspec_train.metrics.sinks import WandbSink

    names = [row.name for row in rows]
    run_name = ("compare " + " vs ".join(names))[:_MAX_RUN_NAME]
    config = {"drafters": names, "sources": [str(row.source) for row in rows], "suites": suites_of(rows)}
    # Directory and group are passed to the run, not left to the environment: W&B keeps the settings of the first
    # run of a process, so a later run would otherwise land in the earlier run's directory and group.
    sink = WandbSink(project, run_name, config, mode="offline", dir=os.environ.get("WANDB_DIR") or out_dir,
                     group=group)
    try:
        summary = main_table(rows)
        sink.log_table("compare/summary", summary.columns, summary.rows, step=0)
        sink.log_table("compare/conditional_acceptance", ["drafter", "suite", "k", "acceptance"],
                       acceptance_long_rows(rows), step=0)
        if any(row.calibration is not None for row in rows):
            calibration = calibration_table(rows)
            sink.log_table("compare/calibration", calibration.columns, calibration.rows, step=0)
        for suite in suites_of(rows):
            curves = [(row.name, row.conditional_acceptance.get(suite, [])) for row in rows]
            curves = [(name, [(k, v) for k, v in enumerate(curve, 1) if v is not None]) for name, curve in curves]
            curves = [(name, points) for name, points in curves if points]
            if not curves:
                continue
            chart = wandb.plot.line_series(
                xs=[[k for k, _ in points] for _, points in curves],
                ys=[[v for _, v in points] for _, points in curves],
                keys=[name for name, _ in curves],
                title=f"P(A_k | A_<k) on {suite}",
                xname="k",
            )
            sink.run.log({f"compare/acceptance_curve/{suite}": chart}, step=0)
        for path in plot_files:
            sink.log_image(f"compare/{path.stem}", path, step=0)
        # run.dir is the run's "files" folder; its parent is the offline run that `wandb sync` uploads.
        return Path(sink.run.dir).parent
    finally:
        sink.finish()


def run(args: argparse.Namespace) -> int:
    out = ensure_output_dir(args.out, "--out")
    try:
        rows = collect_rows(args.paths, args.label or ())
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise UserError(str(err)) from err
    plot_files = write_plots(rows, out)
    report = write_report(rows, out, plot_files)
    print(markdown_table(main_table(rows)))
    print(f"wrote {report} and {len(plot_files)} plot(s) in {out}")
    if args.wandb:
        run_dir = log_to_wandb(rows, plot_files, args.wandb_project, args.wandb_group, out)
        print(f"W&B run in {run_dir}")
    return 0
