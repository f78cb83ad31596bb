"""The convergence curve of the real-model benchmark (``bench/validation_curve.py``): validation E[L] by step over
training seeds, read from the runs' own ``metrics.jsonl``, as a table and a plot."""

from __future__ import annotations

import json
from pathlib import Path

from bench.validation_curve import curve_of, curves_table, plot_curves


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
    assert rows[0] == "| kind | step 10 | step 20 | step 30 | gain over the last interval |"
    assert rows[2] == "| dspark | 0.600 [0.500, 0.700] | 1.067 [0.900, 1.300] |  | +0.467 |"
    assert rows[3] == "| eagle3 | 0.500 | 0.900 | 1.100 | +0.200 |"

    png = plot_curves({"dspark": curve}, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
