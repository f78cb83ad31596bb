"""PNG plots of a drafter comparison: conditional acceptance per position (one file per suite), tau per suite as
grouped bars, tau per position bucket of the decoded answer, and the confidence head's ECE per position before /
after calibration.

Figures come from ``formats.figures`` (matplotlib's object API on the Agg canvas). A plot whose data no drafter
has is not written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from collections.abc import Mapping

import numpy as np
from matplotlib.ticker import MaxNLocator

from deepspec_train.comparison.collect import DrafterRow, suites_of
from deepspec_train.formats.figures import new_figure, save_png

TAU_FILE = "tau_per_suite.png"
CALIBRATION_FILE = "calibration.png"


def acceptance_file(suite: str) -> str:
    """``conditional_acceptance_<suite>.png``, with characters unsafe in file names replaced by ``_``."""
    return f"conditional_acceptance_{re.sub(r'[^A-Za-z0-9_.-]', '_', suite)}.png"


def _floats(values: Sequence[float | None]) -> np.ndarray:
    # NaN leaves a gap in a line instead of drawing a fake zero.
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def plot_per_position(curves: Mapping[str, Sequence[float]], ylabel: str, path: str | os.PathLike) -> Path:
    """One line per named curve over block positions 1..B (e.g. ``{"dspark": accept_means, "dflash": ...}``)."""
    fig = new_figure(6.0, 4.0)
    ax = fig.add_subplot()
    for name, values in curves.items():
        ax.plot(np.arange(1, len(values) + 1), np.asarray(values, dtype=np.float64), marker="o", label=name)
    ax.set_xlabel("block position k")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend()
    return save_png(fig, path)


def plot_conditional_acceptance(rows: Sequence[DrafterRow], suite: str, path: str | os.PathLike) -> Path:
    """One line per drafter evaluated on ``suite``: measured ``P(A_k | A_<k)`` over positions k."""
    curves = {r.name: _floats(r.conditional_acceptance[suite]) for r in rows if r.conditional_acceptance.get(suite)}
    return plot_per_position(curves, f"P(A_k | A_<k) on {suite}", path)


def position_file(axis: str, suite: str) -> str:
    """``tau_by_<axis>_position_<suite>.png``, with characters unsafe in file names replaced by ``_``."""
    return f"tau_by_{axis}_position_{re.sub(r'[^A-Za-z0-9_.-]', '_', suite)}.png"


def plot_tau_by_bucket(
    curves: Mapping[str, Sequence[tuple[float | None, float | None, float | None]]],
    buckets: Sequence[str],
    xlabel: str,
    path: str | os.PathLike,
) -> Path:
    """One line per drafter over position buckets: ``curves[name][b]`` = (tau, interval low, interval high) of
    bucket ``b`` (None where the bucket has no round, or no interval), drawn with the interval as error bars."""
    fig = new_figure(6.0, 4.0)
    ax = fig.add_subplot()
    x = np.arange(len(buckets))
    for i, (name, points) in enumerate(curves.items()):
        tau, low, high = (_floats([p[j] for p in points]) for j in range(3))
        # A bucket with a tau but no interval draws without error bars rather than hiding the point.
        below, above = np.nan_to_num(tau - low, nan=0.0), np.nan_to_num(high - tau, nan=0.0)
        offset = (i - (len(curves) - 1) / 2) * 0.06
        ax.errorbar(x + offset, tau, yerr=[below, above], marker="o", capsize=3, label=name)
    ax.set_xticks(x, list(buckets))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tau (tokens per round, bonus included)")
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend()
    return save_png(fig, path)


def plot_tau_per_suite(rows: Sequence[DrafterRow], path: str | os.PathLike) -> Path:
    """Grouped bars: one group per suite (plus the mean over suites when there are several), one bar per drafter.

    A drafter gets a "mean" bar only if it was evaluated on every suite: a mean over an easier subset of suites
    would not be comparable with the others'."""
    suites = suites_of(rows)
    groups = suites + (["mean"] if len(suites) > 1 else [])

    def mean_over_all(row: DrafterRow) -> float | None:
        return row.mean_tau if all(row.tau.get(s) is not None for s in suites) else None

    fig = new_figure(max(5.0, 1.0 + 0.4 * len(groups) * len(rows)), 4.0)
    ax = fig.add_subplot()
    width = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        values = [mean_over_all(row) if group == "mean" else row.tau.get(group) for group in groups]
        present = [j for j, v in enumerate(values) if v is not None]
        offset = (i - (len(rows) - 1) / 2) * width
        ax.bar([j + offset for j in present], [values[j] for j in present], width, label=row.name)
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set_ylabel("tau (tokens per round, bonus included)")
    ax.grid(True, axis="y", alpha=0.3)
    if rows:
        ax.legend()
    return save_png(fig, path)


def plot_calibration(rows: Sequence[DrafterRow], path: str | os.PathLike) -> Path:
    """ECE of cumulative survival per position, dashed before and solid after STS, one colour per drafter."""
    fig = new_figure(6.0, 4.0)
    ax = fig.add_subplot()
    calibrated = [(r.name, r.calibration) for r in rows if r.calibration is not None]
    for i, (name, calibration) in enumerate(calibrated):
        colour = f"C{i % 10}"
        for values, style, label in (
            (calibration.ece_before, "--", "before"),
            (calibration.ece_after, "-", "after"),
        ):
            ax.plot(np.arange(1, len(values) + 1), _floats(values), style, color=colour, marker="o",
                    label=f"{name} {label}")
    ax.set_xlabel("block position k")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("ECE of cumulative survival S_k")
    ax.grid(True, alpha=0.3)
    if calibrated:
        ax.legend(fontsize=8)
    return save_png(fig, path)


def write_plots(rows: Sequence[DrafterRow], out_dir: str | os.PathLike) -> list[Path]:
    """Write every plot that some drafter has data for into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    written = [
        plot_conditional_acceptance(rows, suite, out / acceptance_file(suite))
        for suite in suites_of(rows)
        if any(r.conditional_acceptance.get(suite) for r in rows)
    ]
    if any(v is not None for r in rows for v in r.tau.values()):
        written.append(plot_tau_per_suite(rows, out / TAU_FILE))
    if any(r.calibration is not None for r in rows):
        written.append(plot_calibration(rows, out / CALIBRATION_FILE))
    return written
