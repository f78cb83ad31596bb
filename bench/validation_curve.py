"""How far from converged a benchmark's drafters are: each kind's validation E[L] (``val/expected_len``, the
analytic expected accepted length on the validation conversations, logged every ``train.eval_every`` steps) by
step, over its training seeds, as a table and a plot.

The last column is the gain over the last evaluation interval: a curve still rising there has not converged, and
the benchmark's ratios are those of drafters at that budget, not of trained-out ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from deepspec_train.formats.figures import new_figure, save_png

METRIC = "val/expected_len"


@dataclass(frozen=True)
class Curve:
    """One kind's validation E[L] at each evaluated step: the mean, lowest and highest over its training seeds."""

    steps: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]

    @property
    def last_gain(self) -> float | None:
        """E[L] gained over the last evaluation interval (None with fewer than two evaluations)."""
        return self.mean[-1] - self.mean[-2] if len(self.mean) > 1 else None


def logged_values(run_dir: Path) -> dict[int, float]:
    """``val/expected_len`` by step, as the run's ``metrics.jsonl`` logged it."""
    values = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if METRIC in record:
            values[record["step"]] = float(record[METRIC])
    return values


def curve_of(run_dirs: list[Path]) -> Curve:
    """The curve over the training seeds' runs, at the steps every run evaluated."""
    per_run = [logged_values(d) for d in run_dirs]
    steps = sorted(set.intersection(*(set(v) for v in per_run))) if per_run else []
    at = [[v[s] for v in per_run] for s in steps]
    return Curve(steps, [sum(x) / len(x) for x in at], [min(x) for x in at], [max(x) for x in at])


def curves_table(curves: dict[str, Curve]) -> str:
    """A markdown table: one row per kind, one column per evaluated step (mean [lowest, highest] over seeds)."""
    steps = sorted({s for c in curves.values() for s in c.steps})
    lines = ["| kind | " + " | ".join(f"step {s}" for s in steps) + " | gain over the last interval |",
             "|---|" + "---|" * (len(steps) + 1)]
    for kind, c in curves.items():
        cells = {s: (f"{m:.3f} [{lo:.3f}, {hi:.3f}]" if hi > lo else f"{m:.3f}")
                 for s, m, lo, hi in zip(c.steps, c.mean, c.low, c.high)}
        gain = "" if c.last_gain is None else f"{c.last_gain:+.3f}"
        lines.append(f"| {kind} | " + " | ".join(cells.get(s, "") for s in steps) + f" | {gain} |")
    return "\n".join(lines)


def plot_curves(curves: dict[str, Curve], path: str | os.PathLike) -> Path:
    """Each kind's mean validation E[L] by step, its seeds' range shaded."""
    fig = new_figure(6.0, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    for kind, c in curves.items():
        line, = ax.plot(c.steps, c.mean, marker="o", label=kind)
        ax.fill_between(c.steps, c.low, c.high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation E[L] (accepted drafts per round)")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_png(fig, path)
