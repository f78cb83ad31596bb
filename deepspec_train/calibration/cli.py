"""``deepspec calibrate``: sequential temperature scaling of the confidence head from evaluator traces.

    deepspec calibrate --traces eval/traces.jsonl [--traces more.jsonl] --out calib/ [--drafter exports/dspark]

Each trace line is one verification round of ``deepspec eval --save-traces`` (``drafted`` K, ``accepted`` n,
``confidence_logits`` [z_1..z_K]). Position k of a round is valid when k <= drafted, and it survived when
accepted >= k. Rounds without confidence logits (a drafter without a confidence head) are skipped and counted.
The command fits the per-position temperatures (``sequential_temperature_scaling``), prints ECE (10 bins),
AUROC and Brier of cumulative survival per position before and after, and writes ``DIR/calibration.json``
(temperatures and metrics) and ``DIR/reliability.png`` (one reliability diagram per position, before vs after).
With ``--drafter`` naming an exported DSpark directory, the temperatures are stored in its config.json as
``confidence_temperatures``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from deepspec_train.calibration.temperature_scaling import cumulative_survival, sequential_temperature_scaling
from deepspec_train.errors import UserError
from deepspec_train.metrics.calibration import ReliabilityCurve, reliability_curve

N_BINS = 10


@dataclass
class TraceArrays:
    """Per-round arrays ``[N, K]`` for STS, and how many rounds carried no confidence logits."""

    logits: np.ndarray
    survived: np.ndarray
    valid: np.ndarray
    skipped: int


def read_traces(paths: Sequence[str | os.PathLike]) -> TraceArrays:
    """Confidence logits, realised cumulative survival and validity of every round in the JSONL ``paths``."""
    rounds: list[tuple[list[float], int, int]] = []
    skipped = 0
    for path in paths:
        with open(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                record = json.loads(line)
                logits = record.get("confidence_logits")
                if logits is None:
                    skipped += 1
                    continue
                drafted, accepted = int(record["drafted"]), int(record["accepted"])
                if not 0 <= accepted <= drafted:
                    raise ValueError(f"{path}:{line_no}: accepted {accepted} outside 0..drafted ({drafted})")
                rounds.append((list(logits), drafted, accepted))
    if not rounds:
        raise ValueError("no trace round has confidence_logits (was the drafter evaluated with a confidence head?)")
    width = max(len(z) for z, _, _ in rounds)
    logits = np.zeros((len(rounds), width))
    survived = np.zeros((len(rounds), width))
    valid = np.zeros((len(rounds), width), dtype=bool)
    positions = np.arange(1, width + 1)
    for n, (z, drafted, accepted) in enumerate(rounds):
        logits[n, : len(z)] = z
        valid[n] = positions <= min(drafted, len(z))
        survived[n] = valid[n] & (positions <= accepted)
    return TraceArrays(logits=logits, survived=survived, valid=valid, skipped=skipped)


def plot_cumulative_reliability(
    before: Sequence[ReliabilityCurve], after: Sequence[ReliabilityCurve], path: str | os.PathLike
) -> Path:
    """One reliability diagram of cumulative survival per block position, uncalibrated vs calibrated."""
    num = len(before)
    cols = min(num, 4)
    rows = math.ceil(num / cols)
    fig = Figure(figsize=(3.2 * cols, 3.2 * rows))
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
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=110)
    return out


def _position_curves(survival: np.ndarray, traces: TraceArrays) -> list[ReliabilityCurve]:
    """Reliability curve of predicted cumulative survival at each position, over the rounds valid there."""
    return [
        reliability_curve(survival[traces.valid[:, k], k], traces.survived[traces.valid[:, k], k], N_BINS)
        for k in range(survival.shape[1])
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", action="append", required=True, help="trace JSONL from `deepspec eval`; repeatable")
    parser.add_argument("--out", required=True, help="directory for calibration.json and reliability.png")
    parser.add_argument("--drafter", default=None, help="exported DSpark directory whose config gets the temperatures")


def run(args: argparse.Namespace) -> int:
    try:
        traces = read_traces(args.traces)
    except (ValueError, KeyError, OSError) as err:
        raise UserError(str(err)) from err
    result = sequential_temperature_scaling(traces.logits, traces.survived, traces.valid, n_bins=N_BINS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        **result.to_dict(),
        "n_bins": N_BINS,
        "num_rounds": int(traces.logits.shape[0]),
        "skipped_rounds": traces.skipped,
        "traces": [str(p) for p in args.traces],
    }
    (out / "calibration.json").write_text(json.dumps(report, indent=2) + "\n")
    before = _position_curves(cumulative_survival(traces.logits, np.ones(traces.logits.shape[1])), traces)
    after = _position_curves(cumulative_survival(traces.logits, result.temperatures), traces)
    plot_cumulative_reliability(before, after, out / "reliability.png")
    print(f"{report['num_rounds']} rounds ({traces.skipped} without confidence logits skipped)")
    print("\n".join(result.summary_lines()))
    print(f"wrote {out / 'calibration.json'} and {out / 'reliability.png'}")
    if args.drafter:
        # Imported here so that calibrating without an export does not load the model stack.
        from deepspec_train.export.exporter import write_confidence_temperatures

        try:
            path = write_confidence_temperatures(args.drafter, result.temperatures)
        except (ValueError, OSError) as err:
            raise UserError(f"temperatures not stored in {args.drafter}: {err}") from err
        print(f"stored confidence_temperatures in {path}")
    return 0
