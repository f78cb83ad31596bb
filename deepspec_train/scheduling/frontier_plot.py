"""The throughput frontier of a simulated run grid: aggregate against per-user tokens/s, one curve per policy (and
confidence source), fixed gammas in greys; what ``deepspec simulate`` writes as ``frontier.png``.

Every scheduler curve gets its own colour and its policy's line style, so two schedulers never share a look; the
concurrency N is written on one curve (the first scheduler's; every curve visits the same loads in the same order
from left to right), not on every point, where the labels of neighbouring curves pile up; the legend sits right of
the axes. The PNG records what it drew (``formats.figures.read_drawn``).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from deepspec_train.formats.figures import distinct_colours, legend_outside, new_figure, save_png
from deepspec_train.scheduling.simulation_tables import curve_label
from deepspec_train.scheduling.simulator import SimulationResult

# A line style per scheduler policy (colours are per curve); fixed gammas are dotted greys.
_POLICY_STYLES = {"scheduler": "-", "async-scheduler": "--", "full-scan-scheduler": "-."}


def plot_frontier(results: Sequence[SimulationResult], path: str | os.PathLike) -> Path:
    """Aggregate tok/s (y) against per-user tok/s (x), one curve per policy, N labelled on one curve."""
    from matplotlib import colormaps

    curves: dict[str, list[SimulationResult]] = defaultdict(list)
    for r in results:
        curves[curve_label(r)].append(r)
    gammas = sorted({r.policy for r in results if r.policy.startswith("gamma=")}, key=lambda p: int(p[6:]))
    schedulers = [label for label, runs in curves.items() if runs[0].policy not in gammas]
    colours = dict(zip(schedulers, distinct_colours(len(schedulers))))
    labelled = schedulers[0] if schedulers else next(iter(curves), None)
    greys = colormaps["Greys"]
    fig = new_figure(8.0, 5.5)
    ax = fig.add_subplot()
    drawn: dict[str, Any] = {"curves": [], "labelled_curve": labelled}
    for label, runs in curves.items():
        runs.sort(key=lambda r: r.concurrency)
        xs, ys = [r.per_user_tok_s for r in runs], [r.aggregate_tok_s for r in runs]
        policy = runs[0].policy
        if policy in gammas:
            colour = greys(0.35 + 0.6 * gammas.index(policy) / max(len(gammas) - 1, 1))
            ax.plot(xs, ys, marker=".", linestyle=":", color=colour, label=label)
        else:
            colour = colours[label]
            ax.plot(xs, ys, marker="o", markersize=4, linestyle=_POLICY_STYLES[policy], color=colour, label=label)
        if label == labelled:
            for r, x, y in zip(runs, xs, ys):
                ax.annotate(f"N={r.concurrency}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
        drawn["curves"].append({"label": label, "colour": colour if isinstance(colour, str) else list(colour),
                                "style": ":" if policy in gammas else _POLICY_STYLES[policy],
                                "concurrency": [r.concurrency for r in runs]})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-user tokens/s")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title("throughput frontier (up and right is better)")
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax, title=f"N = concurrency, on {labelled}" if labelled else None)
    return save_png(fig, path, drawn=drawn)
