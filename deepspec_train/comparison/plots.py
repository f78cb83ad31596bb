"""PNG plots of a drafter comparison: tau per suite as grouped bars with their intervals (and, from ``deepspec
eval``'s tables, the paired ratios against the baseline), the confidence head's ECE per position before / after
calibration, and ``write_plots``, which writes every plot the rows have data for: those two and the per-position
plots of ``comparison.position_plots`` (measured and teacher-forced acceptance, with their counts).

Figures come from ``formats.figures`` (matplotlib's object API on the Agg canvas); each records what it drew in its
PNG. Legends sit right of the axes, one distinct colour per drafter. A plot whose data no drafter has is not
written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from deepspec_train.comparison.collect import DrafterRow, suites_of
from deepspec_train.comparison.position_plots import (
    error_bars, plot_conditional_acceptance, plot_validation_acceptance, settings_title, titled,
)
from deepspec_train.formats.figures import distinct_colours, legend_outside, new_figure, save_png

TAU_FILE = "tau_per_suite.png"
CALIBRATION_FILE = "calibration.png"
VALIDATION_FILE = "validation_acceptance.png"


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


def position_file(axis: str, suite: str) -> str:
    """``tau_by_<axis>_position_<suite>.png``, with characters unsafe in file names replaced by ``_``."""
    return f"tau_by_{axis}_position_{re.sub(r'[^A-Za-z0-9_.-]', '_', suite)}.png"


Ratio = tuple[float, float, float]


def _prompt_label(rows: Sequence[DrafterRow], suite: str) -> str:
    counts = sorted({r.prompts[suite] for r in rows if suite in r.prompts})
    return f"{suite}\n(n={'/'.join(str(n) for n in counts)})" if counts else suite


def plot_tau_per_suite(rows: Sequence[DrafterRow], path: str | os.PathLike,
                       ratios: Mapping[str, Mapping[str, Ratio]] | None = None, baseline: str | None = None) -> Path:
    """Grouped bars: one group per suite (with its prompt count n; plus the mean over suites when there are
    several), one bar per drafter, with its 95% interval where the row has one. With ``ratios`` (drafter -> suite
    or ``geomean`` -> (value, low, high) against ``baseline``) a second panel draws each paired ratio with its
    interval: bars whose intervals overlap can still differ, which the paired ratio resolves.

    A drafter gets a "mean" bar only if it was evaluated on every suite: a mean over an easier subset of suites
    would not be comparable with the others'."""
    suites = suites_of(rows)
    groups = suites + (["mean"] if len(suites) > 1 else [])

    def mean_over_all(row: DrafterRow) -> float | None:
        return row.mean_tau if all(row.tau.get(s) is not None for s in suites) else None

    fig = new_figure(max(6.0, 1.5 + 0.45 * len(groups) * len(rows)), 6.5 if ratios else 4.0)
    # Room between the panels for the suites' two-line tick labels and the ratio panel's title.
    axes = fig.subplots(2, 1, gridspec_kw={"height_ratios": [3, 2], "hspace": 0.55}) if ratios else [fig.add_subplot()]
    ax = axes[0]
    width = 0.8 / max(len(rows), 1)
    colours = dict(zip((r.name for r in rows), distinct_colours(len(rows))))
    settings = settings_title(rows)
    title = "tau per suite" + (" (95% bootstrap interval over prompts)" if any(r.tau_interval for r in rows) else "")
    drawn: dict[str, Any] = {"title": titled(title, settings), "groups": groups, "series": [], "ratios": []}
    for i, row in enumerate(rows):
        values = [mean_over_all(row) if group == "mean" else row.tau.get(group) for group in groups]
        intervals = [row.tau_interval.get(group) for group in groups]
        present = [j for j, v in enumerate(values) if v is not None]
        offset = (i - (len(rows) - 1) / 2) * width
        ax.bar([j + offset for j in present], [values[j] for j in present], width, color=colours[row.name],
               label=row.name)
        # A bar without an interval (the mean over suites, or results without one) draws no error bar.
        bounded = [j for j in present if intervals[j]]
        if bounded:
            ax.errorbar([j + offset for j in bounded], [values[j] for j in bounded], linestyle="none", capsize=3,
                        color="black", yerr=[error_bars([(values[j], intervals[j][0]) for j in bounded]),
                                             error_bars([(intervals[j][1], values[j]) for j in bounded])])
        drawn["series"].append({"label": row.name, "colour": colours[row.name], "y": values,
                                "interval": [list(iv) if iv else None for iv in intervals]})
    ax.set_xticks(np.arange(len(groups)), [_prompt_label(rows, g) for g in groups])
    ax.set_ylabel("tau (tokens per round,\nbonus included)")
    ax.set_title(drawn["title"], fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    legend_outside(ax)
    if ratios:
        _draw_ratios(axes[1], rows, ratios, baseline, colours, drawn)
    drawn["ylim"] = list(ax.get_ylim())
    return save_png(fig, path, drawn=drawn)


def _draw_ratios(ax: Axes, rows: Sequence[DrafterRow], ratios: Mapping[str, Mapping[str, Ratio]],
                 baseline: str | None, colours: Mapping[str, str], drawn: dict[str, Any]) -> None:
    """Each drafter's tau ratio against the baseline per suite and their geometric mean, with the paired
    interval, in the drafter's colour of the bars."""
    suites = suites_of(rows)
    groups = [*suites, *(["geomean"] if len(suites) > 1 else [])]
    names = [r.name for r in rows if r.name in ratios]
    for i, name in enumerate(names):
        cells = [ratios[name].get(g) for g in groups]
        x = np.arange(len(groups)) + (i - (len(names) - 1) / 2) * 0.12
        y = np.array([c[0] if c else np.nan for c in cells])
        error = [error_bars([(c[0], c[1]) if c else (None, None) for c in cells]),
                 error_bars([(c[2], c[0]) if c else (None, None) for c in cells])]
        ax.errorbar(x, y, yerr=error, linestyle="none", marker="o", capsize=3, color=colours[name],
                    label=f"{name} / {baseline}")
        drawn["ratios"].append({"label": f"{name} / {baseline}", "colour": colours[name], "groups": groups,
                                "value": [c[0] if c else None for c in cells],
                                "interval": [[c[1], c[2]] if c else None for c in cells]})
    ax.axhline(1.0, color="0.4", linewidth=1, linestyle="--")
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.margins(y=0.15)
    ax.set_ylabel(f"tau ratio vs {baseline}")
    ax.set_title(f"tau ratio vs {baseline} (paired 95% bootstrap interval over prompts)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    legend_outside(ax)


def plot_calibration(rows: Sequence[DrafterRow], path: str | os.PathLike) -> Path:
    """ECE of cumulative survival per position, dashed before and solid after STS, one colour per drafter; the
    title gives the rounds each drafter's scores come from (at the first position)."""
    fig = new_figure(6.0, 4.0)
    ax = fig.add_subplot()
    calibrated = [(r.name, r.calibration) for r in rows if r.calibration is not None]
    drawn: dict[str, Any] = {"series": []}
    for (name, calibration), colour in zip(calibrated, distinct_colours(len(calibrated))):
        for values, style, label in (
            (calibration.ece_before, "--", "before"),
            (calibration.ece_after, "-", "after"),
        ):
            ax.plot(np.arange(1, len(values) + 1), _floats(values), style, color=colour, marker="o",
                    label=f"{name} {label}")
        drawn["series"].append({"label": name, "colour": colour, "counts": calibration.counts})
    rounds = "; ".join(f"{name} {c.counts[0]:,}" for name, c in calibrated if c.counts)
    drawn["title"] = "confidence calibration" + (f" (rounds: {rounds})" if rounds else "")
    ax.set_title(drawn["title"], fontsize=10)
    ax.set_xlabel("block position k")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("ECE of cumulative survival S_k")
    ax.grid(True, alpha=0.3)
    legend_outside(ax)
    return save_png(fig, path, drawn=drawn)


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
    if any(r.val_accept for r in rows):
        written.append(plot_validation_acceptance(rows, out / VALIDATION_FILE))
    return written
