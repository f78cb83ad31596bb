"""Drafter groups at a production recipe's shapes: a DSpark (``qwen3-8b``) and an EAGLE-3 (``qwen3-8b-eagle3``)
group over one pass of the Qwen3-8B scale copy (36 layers, vocabulary 151,936, the recipes' taps, anchors,
Markov rank and 32,000-token draft vocabulary; ``tests/helpers/scale_world.py``) train 2 steps colocated, each
bit for bit as its recipe trained alone (per-step losses, validation metrics, final weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepspec_train.jobs.entry import main
from deepspec_train.jobs.run import run_training
from deepspec_train.validation import load_recipe
from tests.helpers.scale_world import build_scale_world, scale_overrides

pytestmark = pytest.mark.slow


def history(run_dir: Path) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        kept = {k: v for k, v in record.items() if k.startswith(("train/loss", "train/ce", "train/tv", "val/"))}
        steps.setdefault(record["step"], {}).update(kept)
    return steps


def test_dspark_and_eagle3_groups_train_as_alone_on_the_qwen3_8b_copy(tmp_path: Path) -> None:
    world = build_scale_world(tmp_path / "world", "Qwen3-8B")
    args = ["recipe=qwen3-8b", "compare=[qwen3-8b-eagle3]", *scale_overrides(world, tmp_path / "groups")]
    assert main(args) == 0
    for recipe in ("qwen3-8b", "qwen3-8b-eagle3"):
        group = tmp_path / "groups" / "groups" / f"{recipe}-seed0"
        alone = tmp_path / f"alone-{recipe}"
        run_training(load_recipe(recipe, scale_overrides(world, alone) + ["run.data_seed=0"]))
        got, expected = history(group), history(alone)
        assert sorted(got) == [1, 2] and got == expected
        a = load_file(str(group / "drafter" / "drafter.safetensors"))
        b = load_file(str(alone / "drafter" / "drafter.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
