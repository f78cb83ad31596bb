"""PNG plots for reports and W&B: per-position curves (accuracy, acceptance) and reliability diagrams.

Figures are built with matplotlib's object API on the Agg canvas, never through ``pyplot``: no global figure
state, no display needed, safe on headless cluster nodes and inside training processes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from deepspec_train.metrics.calibration import ReliabilityCurve


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, format="png", dpi=120, bbox_inches="tight")
    return out


def plot_per_position(curves: Mapping[str, Sequence[float]], ylabel: str, path: str | os.PathLike) -> Path:
    """One line per named curve over block positions 1..B (e.g. ``{"dspark": accept_means, "dflash": ...}``)."""
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.add_subplot()
    for name, values in curves.items():
        ax.plot(np.arange(1, len(values) + 1), np.asarray(values, dtype=np.float64), marker="o", label=name)
    ax.set_xlabel("block position k")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend()
    return _save(fig, path)


def plot_reliability(curves: Mapping[str, ReliabilityCurve], path: str | os.PathLike) -> Path:
    """Reliability diagram: mean outcome against mean predicted probability per bin, one line per named curve
    (values from ``calibration.reliability_curve``), with the diagonal of perfect calibration."""
    fig = Figure(figsize=(5.0, 5.0))
    ax = fig.add_subplot()
    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="gray", label="perfect")
    for name, curve in curves.items():
        filled = np.asarray(curve.counts) > 0
        ax.plot(curve.mean_prob[filled], curve.mean_outcome[filled], marker="o", label=name)
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("mean predicted confidence")
    ax.set_ylabel("mean acceptance (c*)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)
