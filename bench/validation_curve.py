"""How far from converged a benchmark's drafters are: each kind's validation E[L] (``val/expected_len``, the
analytic expected accepted length on the validation conversations, logged every ``train.eval_every`` steps) by
step, over its training seeds, as a table and a plot.

The convergence rule (``Curve.converged``): a kind has converged when the last quarter of its training added less
than 5% of its final mean E[L] (linear between evaluations, 0 before the first). A curve still rising faster than
that has not, and the benchmark's ratios are those of drafters at that budget, not of trained-out ones.

``with_target_tokens`` puts a curve on the axis that costs: the target tokens forwarded up to each evaluated step
(with ``train.feature_reuse`` R, step s has used passes 1 .. ceil(s / R)).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from deepspec_train.formats.figures import new_figure, save_png

METRIC = "val/expected_len"
# The convergence rule: the last quarter of training added less than this share of the final E[L].
CONVERGED_GAIN = 0.05


def linear_from_zero(xs: list[float], ys: list[float], x: float) -> float:
    """A learning curve's value at ``x``: linear between the evaluated points ``(xs, ys)`` and from 0 at x = 0, the
    last value after the last point."""
    xs, ys = [0, *xs], [0.0, *ys]
    if x >= xs[-1]:
        return ys[-1]
    k = next(i for i in range(1, len(xs)) if xs[i] >= x)
    return ys[k - 1] + (x - xs[k - 1]) / (xs[k] - xs[k - 1]) * (ys[k] - ys[k - 1])


@dataclass(frozen=True)
class Curve:
    """One kind's validation E[L] at each evaluated step: the mean, lowest and highest over its training seeds."""

    steps: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]
    # Target tokens forwarded up to each evaluated step (empty when not known).
    target_tokens: list[int] = field(default_factory=list)

    @property
    def last_gain(self) -> float | None:
        """E[L] gained over the last evaluation interval (None with fewer than two evaluations)."""
        return self.mean[-1] - self.mean[-2] if len(self.mean) > 1 else None

    def mean_at(self, step: float) -> float:
        """The mean E[L] at ``step`` (``linear_from_zero``)."""
        return linear_from_zero(self.steps, self.mean, step)

    @property
    def last_quarter_share(self) -> float | None:
        """The share of the final mean E[L] that the last quarter of the steps added (None with no evaluation or a
        final E[L] of 0)."""
        if not self.steps or self.mean[-1] <= 0:
            return None
        return (self.mean[-1] - self.mean_at(0.75 * self.steps[-1])) / self.mean[-1]

    @property
    def converged(self) -> bool | None:
        """The convergence rule (module docstring); None when it cannot be judged (fewer than two evaluations)."""
        share = self.last_quarter_share
        return None if share is None or len(self.steps) < 2 else share < CONVERGED_GAIN


def with_target_tokens(curve: Curve, tokens_per_pass: list[int], reuse: int) -> Curve:
    """``curve`` with the target tokens forwarded up to each evaluated step: passes 1 .. ceil(step / reuse) of
    ``tokens_per_pass`` (the plan's own sequences, pass by pass)."""
    passes = [-(-s // reuse) for s in curve.steps]
    if passes and passes[-1] > len(tokens_per_pass):
        raise ValueError(f"step {curve.steps[-1]} needs {passes[-1]} target passes, {len(tokens_per_pass)} known")
    totals = [sum(tokens_per_pass[:p]) for p in passes]
    return Curve(curve.steps, curve.mean, curve.low, curve.high, totals)


def tokens_to_reach(curve: Curve, goal: float) -> float | None:
    """An extrapolation, to be labelled as one wherever it is shown: the target tokens at which the least-squares
    line of mean E[L] against ln(target tokens), fitted to the evaluations of the second half of training (at least
    two), reaches ``goal``. None when the curve has no token axis, too few points, or the fit does not rise."""
    half = [(t, m) for s, t, m in zip(curve.steps, curve.target_tokens, curve.mean) if 2 * s >= curve.steps[-1]]
    if len(half) < 2:
        return None
    xs, ys = [math.log(t) for t, _ in half], [m for _, m in half]
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / spread if spread else 0.0
    if slope <= 0:
        return None
    return math.exp(x_mean + (goal - y_mean) / slope)


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
    lines = ["| kind | " + " | ".join(f"step {s}" for s in steps)
             + " | gain over the last interval | last quarter's share | converged (< 5%) |",
             "|---|" + "---|" * (len(steps) + 3)]
    for kind, c in curves.items():
        cells = {s: (f"{m:.3f} [{lo:.3f}, {hi:.3f}]" if hi > lo else f"{m:.3f}")
                 for s, m, lo, hi in zip(c.steps, c.mean, c.low, c.high)}
        gain = "" if c.last_gain is None else f"{c.last_gain:+.3f}"
        share = "" if c.last_quarter_share is None else f"{100 * c.last_quarter_share:.1f}%"
        verdict = {None: "", True: "yes", False: "no"}[c.converged]
        lines.append(f"| {kind} | " + " | ".join(cells.get(s, "") for s in steps) + f" | {gain} | {share} | {verdict} |")
    tokens = next((c for c in curves.values() if c.target_tokens), None)
    if tokens is not None:
        lines.append("| target tokens | " + " | ".join(
            f"{t:,}" for t in (dict(zip(tokens.steps, tokens.target_tokens)).get(s, 0) for s in steps)) + " | | | |")
    return "\n".join(lines)


def plot_curves(curves: dict[str, Curve], path: str | os.PathLike, seeds: int | None = None) -> Path:
    """Each kind's mean validation E[L] against target tokens when every curve knows them (else by step), its
    seeds' range shaded (``seeds``: how many, for the legend)."""
    fig = new_figure(6.0, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    by_tokens = all(c.target_tokens for c in curves.values())
    for kind, c in curves.items():
        xs = [t / 1e3 for t in c.target_tokens] if by_tokens else c.steps
        line, = ax.plot(xs, c.mean, marker="o", label=kind)
        ax.fill_between(xs, c.low, c.high, color=line.get_color(), alpha=0.2)
    if seeds:
        ax.set_title(f"mean over {seeds} training seeds; shaded: lowest to highest seed", fontsize=9)
    ax.set_xlabel("target tokens forwarded (thousands)" if by_tokens else "training step")
    ax.set_ylabel("validation E[L] (accepted drafts per round)")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_png(fig, path)
