"""The convergence curve of the real-model benchmark (``bench/validation_curve.py``): validation E[L] by step over
training seeds, read from the runs' own ``metrics.jsonl``, as a table and a plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.validation_curve import Curve, curve_of, curves_table, plot_curves, tokens_to_reach, with_target_tokens


def write_run(run_dir: Path, values: dict[int, float]) -> Path:
    run_dir.mkdir(parents=True)
    lines = []
    for step, value in values.items():
        lines.append(json.dumps({"step": step, "train/loss": 1.0 / step}))
        lines.append(json.dumps({"step": step, "val/expected_len": value, "val/loss": 2.0}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_the_curve_is_the_seeds_mean_and_range_at_the_steps_every_seed_evaluated(tmp_path: Path) -> None:
    seeds = [write_run(tmp_path / "s0", {10: 0.5, 20: 0.9, 30: 1.1}),
             write_run(tmp_path / "s1", {10: 0.7, 20: 1.3, 30: 1.4}),
             write_run(tmp_path / "s2", {10: 0.6, 20: 1.0})]
    curve = curve_of(seeds)
    assert curve.steps == [10, 20]
    assert curve.mean == [sum((0.5, 0.7, 0.6)) / 3, sum((0.9, 1.3, 1.0)) / 3]
    assert (curve.low, curve.high) == ([0.5, 0.9], [0.7, 1.3])
    assert curve.last_gain == curve.mean[1] - curve.mean[0]

    table = curves_table({"dspark": curve, "eagle3": curve_of(seeds[:1])})
    rows = table.splitlines()
    assert rows[0] == ("| kind | step 10 | step 20 | step 30 | gain over the last interval | last quarter's share | "
                       "converged (< 5%) |")
    # dspark: E[L] at step 15 is halfway between 0.6 and 1.067 (0.833), so the last quarter added 21.9%.
    assert rows[2] == "| dspark | 0.600 [0.500, 0.700] | 1.067 [0.900, 1.300] |  | +0.467 | 21.9% | no |"
    assert rows[3] == "| eagle3 | 0.500 | 0.900 | 1.100 | +0.200 | 13.6% | no |"

    png = plot_curves({"dspark": curve}, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_convergence_rule_is_the_last_quarters_share_of_the_final_value() -> None:
    """A curve has converged when the last quarter of its steps added less than 5% of its final mean E[L]; the
    value at 3/4 of the steps is read linearly between evaluations (from 0 at step 0)."""
    flat = Curve([100, 200, 300, 400], [1.0, 1.9, 1.98, 2.0], [0.0] * 4, [3.0] * 4)
    # At step 300 the curve is 1.98, so the last quarter added (2.0 - 1.98) / 2.0 = 1%.
    assert abs(flat.last_quarter_share - 0.01) < 1e-12 and flat.converged is True
    rising = Curve([100, 200, 400], [1.0, 1.5, 2.0], [0.0] * 3, [3.0] * 3)
    # Step 300 lies halfway between 200 (1.5) and 400 (2.0): 1.75, so the last quarter added 12.5%.
    assert abs(rising.last_quarter_share - 0.125) < 1e-12 and rising.converged is False
    # One evaluation: at 3/4 of it the line from 0 gives 3/4 of the value; too little to judge.
    single = Curve([8], [1.0], [1.0], [1.0])
    assert abs(single.last_quarter_share - 0.25) < 1e-12 and single.converged is None
    assert Curve([], [], [], []).converged is None


def test_target_tokens_count_the_passes_each_evaluated_step_has_used() -> None:
    """With reuse R, step s has used target passes 1 .. ceil(s / R); the axis sums their tokens."""
    curve = Curve([3, 4, 9], [0.1, 0.2, 0.3], [0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
    per_pass = [10, 20, 30, 40, 50]
    placed = with_target_tokens(curve, per_pass, reuse=2)
    assert placed.target_tokens == [sum(per_pass[:2]), sum(per_pass[:2]), sum(per_pass[:5])]
    assert with_target_tokens(curve, per_pass, reuse=3).target_tokens == [10, 30, 60]
    with pytest.raises(ValueError, match="needs 5 target passes"):
        with_target_tokens(curve, per_pass[:4], reuse=2)
    table = curves_table({"dspark": placed})
    assert table.splitlines()[-1] == "| target tokens | 30 | 30 | 150 | | | |"


def test_the_extrapolation_solves_the_log_line_of_the_second_half() -> None:
    """On a curve that is exactly 0.1 + 0.2 ln(tokens) the fitted line is that line, so the tokens that reach a goal
    are exp((goal - 0.1) / 0.2); the first half of training (here a point far off the line) is not fitted."""
    tokens = [1_000, 4_000, 16_000, 64_000]
    means = [5.0, *(0.1 + 0.2 * math.log(t) for t in tokens[1:])]
    curve = Curve([10, 20, 30, 40], means, means, means, tokens)
    assert math.isclose(tokens_to_reach(curve, 3.0), math.exp((3.0 - 0.1) / 0.2), rel_tol=1e-9)
    # A least-squares line through points off any one line: brute force over the three fitted points.
    noisy = Curve([10, 20, 30, 40], [0.0, 1.0, 1.5, 1.6], [0.0] * 4, [2.0] * 4, tokens)
    xs, ys = [math.log(t) for t in tokens[1:]], [1.0, 1.5, 1.6]
    slope = ((xs[0] - sum(xs) / 3) * (ys[0] - sum(ys) / 3) + (xs[1] - sum(xs) / 3) * (ys[1] - sum(ys) / 3)
             + (xs[2] - sum(xs) / 3) * (ys[2] - sum(ys) / 3)) / sum((x - sum(xs) / 3) ** 2 for x in xs)
    expected = math.exp(sum(xs) / 3 + (2.0 - sum(ys) / 3) / slope)
    assert math.isclose(tokens_to_reach(noisy, 2.0), expected, rel_tol=1e-9)
    falling = Curve([10, 20], [1.0, 0.9], [0.0] * 2, [1.0] * 2, [100, 200])
    assert tokens_to_reach(falling, 2.0) is None
    assert tokens_to_reach(Curve([10], [1.0], [1.0], [1.0], [100]), 2.0) is None
    assert tokens_to_reach(Curve([10, 20], [0.5, 1.0], [0.0] * 2, [1.0] * 2), 2.0) is None
