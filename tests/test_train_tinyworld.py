"""Integration: each drafter kind trains on the tiny world through the real entry points and logs the
per-position metrics the issue asks for (accuracy, c*_k, validation E[L], confidence ECE / AUROC)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from deepspec_train.validation import load_recipe
from deepspec_train.jobs.run import run_training

REPO = Path(__file__).resolve().parents[1]
# The `test` preset's target has 2 decoder layers: context can only come from layer 0.
LAYER_IDS = {"tiny-dspark": "[0]", "tiny-dflash": "[0]", "tiny-eagle3": "[0,0,0]"}


def overrides(tiny_world: Path, recipe: str, out: Path, steps: int = 4) -> list[str]:
    mask_id = json.loads((tiny_world / "build_report.json").read_text())["mask_token_id"]
    return [
        f"target.path={tiny_world / 'target'}",
        f"target.layer_ids={LAYER_IDS[recipe]}",
        f"data.train=[{tiny_world / 'conversations' / 'train.jsonl'}]",
        f"data.validation=[{tiny_world / 'conversations' / 'validation.jsonl'}]",
        f"data.cache_dir={out / 'cache'}",
        f"drafter.mask_token_id={mask_id}",
        f"run.output_dir={out / 'run'}",
        f"train.max_steps={steps}",
        "train.global_batch_sequences=4",
        "train.micro_batch_sequences=2",
        f"train.eval_every={steps}",
        "train.eval_sequences=8",
        f"train.checkpoint_every={steps}",
        "anchors.num_per_sequence=8",
        "logging.log_every=1",
        "logging.wandb=false",
        "logging.progress=false",
    ]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("recipe", ["tiny-dspark", "tiny-eagle3"])
def test_recipe_trains_and_logs_per_position_metrics(tiny_world: Path, tmp_path: Path, recipe: str) -> None:
    cfg = load_recipe(recipe, overrides(tiny_world, recipe, tmp_path))
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
        [sys.executable, "train.py", "recipe=tiny-dflash", *overrides(tiny_world, "tiny-dflash", tmp_path, steps=2)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(tmp_path / "run")
    assert records[-1]["step"] == 2
    config = json.loads((tmp_path / "run" / "drafter" / "drafter_config.json").read_text())
    assert config["kind"] == "dflash" and config["drafter"]["markov_rank"] == 0
