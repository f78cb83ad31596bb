"""``deepspec calibrate``: sequential temperature scaling of the confidence head from evaluator traces.

    deepspec calibrate --traces eval/traces.jsonl [--traces more.jsonl] --out calib/ [--drafter exports/dspark] \
        [--dataset NAME]

Each trace line is one verification round of ``deepspec eval --save-traces`` (``drafted`` K, ``accepted`` n,
``confidence_logits`` [z_1..z_K]). Position k of a round is valid when k <= drafted, and it survived when
accepted >= k. Rounds without confidence logits (a drafter without a confidence head) are skipped and counted.
The command fits the per-position temperatures (``sequential_temperature_scaling``), prints ECE (10 bins),
AUROC and Brier of cumulative survival per position before and after, and writes

- ``DIR/calibration.json``: temperatures and metrics (strict JSON: a metric without data is ``null``);
- ``DIR/sglang_sts.json``: SGLang's STS file (``--speculative-dspark-confidence-sts-path``): the temperatures,
  ``num_samples`` (rounds used), per-position ``ece_before`` / ``ece_after`` when every position has data, and
  ``dataset`` (``--dataset``, default the trace suites' names);
- ``DIR/reliability.png``: one reliability diagram per position, before vs after.

With ``--drafter`` naming an exported DSpark directory, the temperatures are stored in its config.json as
``confidence_temperatures`` (read by this project's loader; no engine reads them) and the STS file is copied
next to it. ``deepspec export --calibration DIR/calibration.json`` does the same at export time.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepspec_train.calibration.temperature_scaling import cumulative_survival, sequential_temperature_scaling
from deepspec_train.common.errors import UserError
from deepspec_train.common.output_paths import check_output_dir, ensure_output_dir
from deepspec_train.export.engine_files import STS_FILENAME, sts_payload, write_strict_json
from deepspec_train.formats.eval_traces import TraceRound, read_traces
from deepspec_train.formats.figures import new_figure, save_png
from deepspec_train.metrics.calibration import ReliabilityCurve, reliability_curve
from deepspec_train.common.model_folders import check_drafter_folder

N_BINS = 10


@dataclass
class TraceArrays:
    """Per-round arrays ``[N, K]`` for STS, and how many rounds carried no confidence logits."""

    logits: np.ndarray
    survived: np.ndarray
    valid: np.ndarray
    skipped: int
    suites: list[str]


def survival_arrays(rounds: Sequence[TraceRound]) -> TraceArrays:
    """Confidence logits, realised cumulative survival and validity of every round that has confidence logits."""
    scored = [r for r in rounds if r.confidence_logits is not None]
    if not scored:
        raise ValueError("no trace round has confidence_logits (was the drafter evaluated with a confidence head?)")
    width = max(len(r.confidence_logits) for r in scored)
    logits = np.zeros((len(scored), width))
    survived = np.zeros((len(scored), width))
    valid = np.zeros((len(scored), width), dtype=bool)
    positions = np.arange(1, width + 1)
    for n, r in enumerate(scored):
        logits[n, : len(r.confidence_logits)] = r.confidence_logits
        valid[n] = positions <= r.drafted
        survived[n] = valid[n] & (positions <= r.accepted)
    suites = sorted({r.suite for r in scored})
    return TraceArrays(logits=logits, survived=survived, valid=valid, skipped=len(rounds) - len(scored), suites=suites)


def plot_cumulative_reliability(
    before: Sequence[ReliabilityCurve], after: Sequence[ReliabilityCurve], path: str | os.PathLike
) -> Path:
    """One reliability diagram of cumulative survival per block position, uncalibrated vs calibrated."""
    num = len(before)
    cols = min(num, 4)
    rows = math.ceil(num / cols)
    fig = new_figure(3.2 * cols, 3.2 * rows)
    for k in range(num):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="gray")
        for name, curve in (("before", before[k]), ("after", after[k])):
            filled = curve.counts > 0
            ax.plot(curve.mean_prob[filled], curve.mean_outcome[filled], marker="o", label=name)
        ax.set_xlim(0.0, 1.0)
        ax.set_ylim(0.0, 1.0)
        ax.set_title(f"position {k + 1} (n={int(before[k].counts.sum())})", fontsize=9)
        ax.set_xlabel("predicted survival")
        ax.set_ylabel("realised survival")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, path, dpi=110)


def _position_curves(survival: np.ndarray, traces: TraceArrays) -> list[ReliabilityCurve]:
    """Reliability curve of predicted cumulative survival at each position, over the rounds valid there."""
    return [
        reliability_curve(survival[traces.valid[:, k], k], traces.survived[traces.valid[:, k], k], N_BINS)
        for k in range(survival.shape[1])
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", action="append", required=True, help="trace JSONL from `deepspec eval`; repeatable")
    parser.add_argument("--out", required=True, help="directory for calibration.json and reliability.png")
    parser.add_argument("--drafter", default=None,
                        help="exported DSpark directory whose config gets the temperatures (and the STS file)")
    parser.add_argument("--dataset", default=None, help="name recorded in the STS file (default: the trace suites)")


def run(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")
    if args.drafter:
        check_drafter_folder(args.drafter, "--drafter")
    out = ensure_output_dir(args.out, "--out")
    try:
        traces = survival_arrays(read_traces(args.traces))
    except (ValueError, KeyError, OSError) as err:
        raise UserError(str(err)) from err
    result = sequential_temperature_scaling(traces.logits, traces.survived, traces.valid, n_bins=N_BINS)
    report = {
        **result.to_dict(),
        "n_bins": N_BINS,
        "num_rounds": int(traces.logits.shape[0]),
        "skipped_rounds": traces.skipped,
        "traces": [str(p) for p in args.traces],
    }
    write_strict_json(out / "calibration.json", report)
    dataset = args.dataset or "+".join(traces.suites) or None
    sts = sts_payload(result.temperatures, report["num_rounds"], result.ece_before, result.ece_after, dataset)
    write_strict_json(out / STS_FILENAME, sts)
    before = _position_curves(cumulative_survival(traces.logits, np.ones(traces.logits.shape[1])), traces)
    after = _position_curves(cumulative_survival(traces.logits, result.temperatures), traces)
    plot_cumulative_reliability(before, after, out / "reliability.png")
    print(f"{report['num_rounds']} rounds ({traces.skipped} without confidence logits skipped)")
    print("\n".join(result.summary_lines()))
    print(f"wrote {out / 'calibration.json'}, {out / STS_FILENAME} and {out / 'reliability.png'}")
    if args.drafter:
        # Imported here so that calibrating without an export does not load the model stack.
        from deepspec_train.export.exporter import write_confidence_temperatures

        try:
            path = write_confidence_temperatures(args.drafter, result.temperatures)
        except (ValueError, OSError) as err:
            raise UserError(f"temperatures not stored in {args.drafter}: {err}") from err
        write_strict_json(Path(args.drafter) / STS_FILENAME, sts)
        print(f"stored confidence_temperatures in {path} and {Path(args.drafter) / STS_FILENAME} beside it")
    return 0
