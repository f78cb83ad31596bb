"""Integration: each drafter kind trains on the tiny world through the real entry points and logs the
per-position metrics the issue asks for (accuracy, c*_k, validation E[L], confidence ECE / AUROC)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.jobs.run import run_training
from tests.helpers.tiny_world_overrides import training_overrides

REPO = Path(__file__).resolve().parents[1]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("recipe", ["tiny-dspark", "tiny-eagle3"])
def test_recipe_trains_and_logs_per_position_metrics(tiny_world: Path, tmp_path: Path, recipe: str) -> None:
    cfg = load_recipe(recipe, training_overrides(tiny_world, recipe, tmp_path))
    summary = run_training(cfg)
    assert summary.steps == 4
    records = read_metrics(tmp_path / "run")
    train = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(r["train/loss"] > 0 for r in train)
    assert "train/acc_1" in train[0] and "train/accept_1" in train[0]
    val = [r for r in records if "val/loss" in r][-1]
    assert val["val/expected_len"] > 0
    if recipe == "tiny-dspark":
        assert 0 <= val["val/conf_ece"] <= 1
        assert "val/conf_auroc" in val
    assert (tmp_path / "run" / "resolved_config.yaml").is_file()
    weights = load_file(str(tmp_path / "run" / "drafter" / "drafter.safetensors"))
    # Frozen copies of the target's embedding / LM head are never saved; EAGLE-3 trains its own draft LM head.
    assert "embed_tokens.weight" not in weights
    assert ("lm_head.weight" in weights) == (recipe == "tiny-eagle3")


@pytest.mark.slow
def test_train_py_runs_dflash(tiny_world: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "train.py", "recipe=tiny-dflash",
         *training_overrides(tiny_world, "tiny-dflash", tmp_path, steps=2)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(tmp_path / "run")
    assert records[-1]["step"] == 2
    config = json.loads((tmp_path / "run" / "drafter" / "drafter_config.json").read_text())
    assert config["kind"] == "dflash" and config["drafter"]["markov_rank"] == 0
