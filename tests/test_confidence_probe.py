"""``bench/confidence_probe.py`` on a drafter the real entry point trained on the tiny world: the table has a row per
head and a column per block position, and no head ranks Bernoulli(c*) outcomes better than c* itself (ordering
by c* maximises every pair's expected concordance, so the ceiling row is an upper bound, not an estimate)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.confidence_probe import main
from deepspec_train.jobs.run import run_training
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.tiny_world_overrides import training_overrides


def test_probe_table_is_bounded_by_the_ceiling(tiny_world: Path, tmp_path: Path) -> None:
    cfg = load_recipe("tiny-dspark", training_overrides(tiny_world, "tiny-dspark", tmp_path)
                      + ["drafter.num_layers=2", "drafter.markov_rank=16"])
    assert run_training(cfg).steps == 4
    out = tmp_path / "probe.json"
    report = main(["--run", str(tmp_path / "run"), "--train-steps", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["columns"] == ["head", *(f"k={k}" for k in range(1, 8)), "pooled"]
    assert report["fit_rows"] > 0 and report["validation_rows"] > 0
    names = [row[0] for row in report["rows"]]
    assert names[:2] == ["ceiling: c* itself", "trained head"] and len(names) == 5
    ceiling = [float(v) for v in report["rows"][0][1:]]
    for row in report["rows"][1:]:
        values = [float(v) for v in row[1:]]
        assert all(not math.isnan(v) and 0.0 <= v <= c + 1e-3 for v, c in zip(values, ceiling)), row
