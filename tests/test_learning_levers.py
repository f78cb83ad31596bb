"""``bench/learning_levers.py``'s arithmetic against brute force: a variant's E[L] interpolated at a number of
target passes, the share of its E[L] its last quarter of passes added (the convergence rule), a reuse run's
evaluation steps counted in target passes, the table's comparisons at equal tokens and equal wall time, and the
recipes it writes (each validates, with its optimizer steps per pass)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.learning_levers import VARIANTS, LeverCurve, lever_curve, plot, report, write_recipes
from deepspec_train.kinds.recipe_validation import load_recipe


def test_interpolation_and_the_convergence_rule() -> None:
    curve = LeverCurve([10, 20, 40], [[0.1, 0.3, 0.5], [0.3, 0.5, 0.7]])
    assert curve.mean == pytest.approx([0.2, 0.4, 0.6])
    assert curve.at(5) == pytest.approx([0.05, 0.15])
    assert curve.at(30) == pytest.approx([0.4, 0.6])
    assert curve.at(99) == pytest.approx([0.5, 0.7])
    # 0.75 * 40 = 30 passes: mean 0.5; the last quarter added 0.1 of the final 0.6.
    assert curve.last_quarter_gain() == pytest.approx(0.1 / 0.6)


def test_a_reuse_run_is_read_in_target_passes(tmp_path: Path) -> None:
    for seed, values in enumerate(([0.1, 0.2], [0.3, 0.4])):
        run = tmp_path / f"s{seed}"
        run.mkdir()
        lines = [{"step": 1, "train/loss": 1.0}, {"step": 8, "val/expected_len": values[0]},
                 {"step": 16, "val/expected_len": values[1]}]
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    curve = lever_curve([tmp_path / "s0", tmp_path / "s1"], reuse=4)
    assert curve.passes == [2, 4] and curve.per_seed == [[0.1, 0.2], [0.3, 0.4]]


def test_the_table_compares_at_equal_tokens_and_equal_wall_time(tmp_path: Path) -> None:
    curves = {"today": LeverCurve([10, 20], [[0.2, 0.4]]), "reuse-4": LeverCurve([10, 20], [[0.4, 0.8]])}
    # reuse-4 takes twice as long per pass: at today's wall time (20 passes) it has done 10.
    table, record = report(curves, {"today": 1.0, "reuse-4": 2.0}, [100] * 20, seeds=1)
    assert record["reuse-4"]["at_equal_tokens"] == pytest.approx([0.8])
    assert record["reuse-4"]["ratio_tokens"] == pytest.approx([2.0])
    assert record["reuse-4"]["at_equal_wall"] == pytest.approx([0.4])
    assert record["reuse-4"]["ratio_wall"] == pytest.approx([1.0])
    assert "2,000 target tokens" in table and table.count("\n| ") == 3
    assert plot(curves, {"today": 1.0, "reuse-4": 2.0}, [100] * 20, tmp_path / "curves.png").is_file()


def test_every_variant_recipe_validates(tmp_path: Path, monkeypatch) -> None:
    folder = write_recipes(list(VARIANTS), tmp_path, passes=12, evaluations=3, eval_sequences=8)
    monkeypatch.setenv("DEEPSPEC_RECIPES", str(folder))
    for variant in VARIANTS:
        cfg = load_recipe(variant.recipe, check_target=False)
        assert cfg.train.feature_reuse == variant.reuse
        assert cfg.train.max_steps == 12 * variant.reuse and cfg.train.eval_every == 4 * variant.reuse
        assert cfg.train.global_batch_sequences == 4
