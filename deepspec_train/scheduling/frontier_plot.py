"""The throughput frontier of a simulated run grid: aggregate against per-user tokens/s, one curve per policy (and
confidence source), fixed gammas in greys; what ``deepspec simulate`` writes as ``frontier.png``."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from deepspec_train.formats.figures import new_figure, save_png
from deepspec_train.scheduling.simulation_tables import curve_label
from deepspec_train.scheduling.simulator import SimulationResult

# Frontier styling: a colour per confidence source, a line style per scheduler policy, greys for fixed gamma.
_SOURCE_COLOURS = {
    None: "tab:blue",
    "trace": "tab:blue",
    "uncalibrated": "tab:orange",
    "calibrated": "tab:green",
    "oracle": "tab:purple",
}
_POLICY_STYLES = {"scheduler": "-", "async-scheduler": "--", "full-scan-scheduler": "-."}


def plot_frontier(results: Sequence[SimulationResult], path: str | os.PathLike) -> Path:
    """Aggregate tok/s (y) against per-user tok/s (x), one curve per policy, points labelled by concurrency."""
    from matplotlib import colormaps

    curves: dict[str, list[SimulationResult]] = defaultdict(list)
    for r in results:
        curves[curve_label(r)].append(r)
    gammas = sorted({r.policy for r in results if r.policy.startswith("gamma=")}, key=lambda p: int(p[6:]))
    greys = colormaps["Greys"]
    fig = new_figure(8.0, 5.5)
    ax = fig.add_subplot()
    for label, runs in curves.items():
        runs.sort(key=lambda r: r.concurrency)
        xs, ys = [r.per_user_tok_s for r in runs], [r.aggregate_tok_s for r in runs]
        policy = runs[0].policy
        if policy in gammas:
            shade = 0.35 + 0.6 * gammas.index(policy) / max(len(gammas) - 1, 1)
            ax.plot(xs, ys, marker=".", linestyle=":", color=greys(shade), label=label)
        else:
            colour = _SOURCE_COLOURS.get(runs[0].confidence_source, "tab:red")
            ax.plot(xs, ys, marker="o", markersize=4, linestyle=_POLICY_STYLES[policy], color=colour, label=label)
        for r, x, y in zip(runs, xs, ys):
            ax.annotate(f"N={r.concurrency}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-user tokens/s")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title("throughput frontier (up and right is better)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return save_png(fig, path)
