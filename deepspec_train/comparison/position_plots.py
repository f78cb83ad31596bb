"""Per-position plots of a drafter comparison, each drawn with the rounds behind its points: conditional acceptance
``P(A_k | A_<k)`` per block position (measured by ``deepspec eval``), teacher-forced acceptance ``c*_k`` per block
position (training validation), and tau per position bucket of the decoded answer.

A rate from a few rounds is noise that looks like a finding (``P = 1.0`` at a late position reached by three
rounds), so every point carries its count: points from fewer than ``MIN_ROUNDS`` rounds are drawn hollow and grey
and the legend says so; the acceptance plots have a second panel with the rounds per position. Titles name the
sampling temperature and seeds where the inputs record them. Each plot records what it drew in its PNG
(``formats.figures.read_drawn``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from deepspec_train.comparison.collect import DrafterRow
from deepspec_train.formats.figures import distinct_colours, legend_outside, new_figure, save_png

# The stated minimum: a point from fewer rounds than this is greyed (its binomial standard error can exceed 0.09).
MIN_ROUNDS = 30
GREY = "0.6"


def json_values(values: Sequence[float | None] | np.ndarray) -> list[float | None]:
    """Plotted values for the PNG's record: NaN (a gap in a line) becomes None."""
    return [None if v is None or not np.isfinite(v) else float(v) for v in values]


def error_bars(pairs: Sequence[tuple[float | None, float | None]]) -> np.ndarray:
    """``a - b`` per pair, 0 where either is missing, and never negative: a percentile interval need not hold its
    point estimate (and a degenerate one differs from it by rounding), while matplotlib refuses negative bars."""
    return np.array([max(a - b, 0.0) if a is not None and b is not None else 0.0 for a, b in pairs])


def _joined(values: Sequence[Any]) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def settings_title(rows: Sequence[DrafterRow]) -> str:
    """``T = 1, seeds 0, 1`` from the rows' evaluation settings (several values when the drafters differ),
    ``""`` when no row records them."""
    temperatures = sorted({r.temperature for r in rows if r.temperature is not None})
    seeds = sorted({s for r in rows for s in r.seeds})
    parts = []
    if temperatures:
        parts.append(f"T = {_joined(temperatures)}")
    if seeds:
        parts.append(f"seed{'s' if len(seeds) > 1 else ''} {_joined(seeds)}")
    return ", ".join(parts)


def titled(text: str, settings: str) -> str:
    """``text, settings`` (``text`` alone without settings)."""
    return f"{text}, {settings}" if settings else text


def _explain_greyed(ax: Axes, series: Sequence[dict[str, Any]]) -> None:
    """A legend entry for hollow grey points, when a series has one."""
    if any(any(s["greyed"]) for s in series):
        ax.plot([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor=GREY,
                label=f"fewer than {MIN_ROUNDS} rounds")


def probability_limits(values: Sequence[float], min_span: float = 0.25) -> tuple[float, float]:
    """Y limits that fit probabilities ``values`` with a margin, at least ``min_span`` wide (so a spread of a
    percent is not blown up to the full height) and never past [0, 1] by more than a marker."""
    if not values:
        return -0.03, 1.03
    low, high = min(values), max(values)
    pad = max(0.1 * (high - low), (min_span - (high - low)) / 2, 0.0)
    low, high = low - pad, high + pad
    # Keep the span when a limit meets the [0, 1] border: shift the window instead of cutting it.
    low, high = (low, high) if low >= 0 else (0.0, high - low)
    low, high = (low, high) if high <= 1 else (low - (high - 1), 1.0)
    return max(low, 0.0) - 0.03, min(high, 1.0) + 0.03


@dataclass(frozen=True)
class CountedCurve:
    """One line of a per-position plot: ``values[k-1]`` (None: position not reached) from ``counts[k-1]`` rounds
    (``counts`` empty when the input does not record them)."""

    name: str
    values: Sequence[float | None]
    counts: Sequence[int]


def _draw_counted(ax: Axes, x: np.ndarray, y: np.ndarray, counts: Sequence[int], colour: str, label: str,
                  yerr: np.ndarray | None = None) -> list[bool]:
    """A curve whose points below ``MIN_ROUNDS`` are hollow grey: the line faint through every point, solid
    markers (and error bars) only where the count suffices. Returns which points were greyed."""
    greyed = [bool(counts) and bool(np.isfinite(v)) and n < MIN_ROUNDS for v, n in zip(y, counts or [0] * len(y))]
    solid = np.where(greyed, np.nan, y)
    ax.plot(x, y, linestyle=":", color=colour, alpha=0.5)
    if yerr is not None:
        ax.errorbar(x, solid, yerr=np.where(greyed, 0.0, yerr), linestyle="none", marker="o", color=colour,
                    capsize=3, label=label)
    else:
        ax.plot(x, solid, linestyle="none", marker="o", color=colour, label=label)
    ax.plot(x, np.where(greyed, y, np.nan), linestyle="none", marker="o", markerfacecolor="none",
            markeredgecolor=GREY)
    return greyed


def plot_counted_positions(curves: Sequence[CountedCurve], ylabel: str, title: str, path: str | os.PathLike,
                           count_label: str = "rounds reaching k") -> Path:
    """Rates per block position k (top) over the rounds behind them (bottom, log scale, with the minimum)."""
    fig = new_figure(7.5, 5.5)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    colours = distinct_colours(len(curves))
    width = 0.8 / max(len(curves), 1)
    drawn: dict[str, Any] = {"title": title, "min_rounds": MIN_ROUNDS, "series": []}
    for i, (curve, colour) in enumerate(zip(curves, colours)):
        offset = (i - (len(curves) - 1) / 2) * width
        x = np.arange(1, len(curve.values) + 1)
        y = np.array([np.nan if v is None else v for v in curve.values], dtype=np.float64)
        # Points sit over their drafter's count bar, so equal curves stay visible side by side.
        greyed = _draw_counted(top, x + offset, y, curve.counts, colour, curve.name)
        # A position no round reached has no bar (a log axis has no zero): a "0" at the foot says so.
        reached = [i for i, n in enumerate(curve.counts) if n > 0]
        bottom.bar(x[reached] + offset, [curve.counts[i] for i in reached], width, color=colour)
        for i in sorted(set(range(len(curve.counts))) - set(reached)):
            bottom.annotate("0", (x[i] + offset, 0.0), xycoords=("data", "axes fraction"), xytext=(0, 2),
                            textcoords="offset points", ha="center", fontsize=7, color=colour)
        drawn["series"].append({"label": curve.name, "colour": colour, "x": x.tolist(), "y": json_values(y),
                                "counts": list(curve.counts) or None, "greyed": greyed})
    top.set_ylabel(ylabel)
    top.set_ylim(*probability_limits([v for c in curves for v in c.values if v is not None]))
    top.grid(True, alpha=0.3)
    top.set_title(title, fontsize=10)
    _explain_greyed(top, drawn["series"])
    bottom.axhline(MIN_ROUNDS, color=GREY, linestyle="--", linewidth=1, label=f"minimum ({MIN_ROUNDS})")
    bottom.set_yscale("log")
    counts = [n for c in curves for n in c.counts if n > 0]
    bottom.set_ylim(0.5 * min([MIN_ROUNDS, *counts]), 2.0 * max([MIN_ROUNDS, *counts]))
    bottom.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    bottom.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    bottom.yaxis.set_minor_formatter(NullFormatter())
    bottom.set_ylabel(count_label)
    bottom.set_xlabel("block position k")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.grid(True, axis="y", alpha=0.3)
    legend_outside(top)
    legend_outside(bottom)
    drawn["ylim"] = list(top.get_ylim())
    return save_png(fig, path, drawn=drawn)


def plot_conditional_acceptance(rows: Sequence[DrafterRow], suite: str, path: str | os.PathLike) -> Path:
    """One curve per drafter evaluated on ``suite``: measured ``P(A_k | A_<k)`` over positions k, with the rounds
    that reached each position."""
    curves = [CountedCurve(r.name, r.conditional_acceptance[suite], r.acceptance_rounds.get(suite, []))
              for r in rows if r.conditional_acceptance.get(suite)]
    settings = settings_title([r for r in rows if r.conditional_acceptance.get(suite)])
    return plot_counted_positions(curves, "P(A_k | A_<k)", titled(f"conditional acceptance on {suite}", settings),
                                  path)


def plot_validation_acceptance(rows: Sequence[DrafterRow], path: str | os.PathLike) -> Path:
    """One curve per training run: the last validation's teacher-forced ``c*_k`` over positions k, with the
    blocks that supervised each position."""
    shown = [r for r in rows if r.val_accept]
    curves = [CountedCurve(f"{r.name} (step {r.val_step})" if r.val_step is not None else r.name, r.val_accept,
                           r.val_counts) for r in shown]
    seeds = sorted({r.train_seed for r in shown if r.train_seed is not None})
    settings = f"training seed{'s' if len(seeds) > 1 else ''} {_joined(seeds)}" if seeds else ""
    return plot_counted_positions(curves, "mean c*_k (teacher forced)",
                                  titled("teacher-forced acceptance at the last validation", settings), path,
                                  "blocks reaching k")


@dataclass(frozen=True)
class BucketPoint:
    """One drafter's tau in one position bucket, its interval (None: none) and the rounds behind it."""

    tau: float | None
    low: float | None
    high: float | None
    rounds: int


def plot_tau_by_bucket(
    curves: Mapping[str, Sequence[BucketPoint]],
    buckets: Sequence[str],
    xlabel: str,
    title: str,
    path: str | os.PathLike,
) -> Path:
    """One curve per drafter over the position buckets that hold a round (empty buckets are named under the axis,
    not drawn), each point with its interval and rounds."""
    used = [b for b in range(len(buckets)) if any(points[b].tau is not None for points in curves.values())]
    empty = [buckets[b] for b in range(len(buckets)) if b not in used]
    fig = new_figure(7.0, 4.0)
    ax = fig.add_subplot()
    x = np.arange(len(used), dtype=np.float64)
    drawn: dict[str, Any] = {"title": title, "min_rounds": MIN_ROUNDS, "buckets": [buckets[b] for b in used],
                             "empty_buckets": empty, "series": []}
    colours = distinct_colours(len(curves))
    for i, ((name, points), colour) in enumerate(zip(curves.items(), colours)):
        shown = [points[b] for b in used]
        tau = np.array([np.nan if p.tau is None else p.tau for p in shown])
        # A point without an interval keeps its marker and draws no bar.
        below = error_bars([(p.tau, p.low) for p in shown])
        above = error_bars([(p.high, p.tau) for p in shown])
        xs = x + (i - (len(curves) - 1) / 2) * 0.08
        greyed = _draw_counted(ax, xs, tau, [p.rounds for p in shown], colour, name, yerr=np.stack([below, above]))
        for xi, p in zip(xs, shown):
            if p.tau is not None:
                ax.annotate(f"{p.rounds}", (xi, p.tau), textcoords="offset points", xytext=(5, -3), fontsize=7,
                            color=colour)
        drawn["series"].append({"label": name, "colour": colour, "y": json_values(tau),
                                "low": [p.low for p in shown], "high": [p.high for p in shown],
                                "counts": [p.rounds for p in shown], "greyed": greyed})
    ax.set_xticks(x, [buckets[b] for b in used])
    ax.set_xlim(-0.5, max(len(used), 1) - 0.5)
    ax.margins(y=0.15)
    ax.set_xlabel(xlabel + (f"\n(no rounds in {', '.join(empty)})" if empty else ""))
    ax.set_ylabel("tau (tokens per round, bonus included)")
    ax.set_title(title + "\n95% bootstrap interval over prompts; numbers: rounds", fontsize=10)
    ax.grid(True, alpha=0.3)
    _explain_greyed(ax, drawn["series"])
    legend_outside(ax)
    drawn["xlim"], drawn["ylim"] = list(ax.get_xlim()), list(ax.get_ylim())
    return save_png(fig, path, drawn=drawn)
