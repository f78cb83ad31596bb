"""DFlash2 trains on the tiny world through the real entry point: ``tiny-dflash2`` at the test world's taps, two
steps with validation and a checkpoint, its selector and convolutions saved; then a second run warm-starts from a
z-lab-label DFlash run (``drafter.init_from``) and starts from that DFlash's backbone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

from deepspec_train.jobs.run import run_training
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.tiny_world_overrides import training_overrides


def _overrides(tiny_world: Path, out: Path, *extra: str) -> list[str]:
    # The test world's target has 2 layers: DFlash's taps ([0]); its width (64) takes groups of 16.
    return training_overrides(tiny_world, "tiny-dflash", out, steps=2) + ["drafter.num_layers=1", *extra]


def test_tiny_dflash2_trains_and_warm_starts_from_a_dflash(tiny_world: Path, tmp_path: Path) -> None:
    dflash_cfg = load_recipe("tiny-dflash", _overrides(tiny_world, tmp_path / "dflash", "drafter.labels=zlab",
                                                        "drafter.block_size=8"))
    assert run_training(dflash_cfg).steps == 2
    dflash = load_file(str(tmp_path / "dflash" / "run" / "drafter" / "drafter.safetensors"))

    cfg = load_recipe("tiny-dflash2", _overrides(
        tiny_world, tmp_path / "dflash2", f"drafter.init_from={tmp_path / 'dflash' / 'run'}", "train.lr=1e-30"))
    assert run_training(cfg).steps == 2
    records = [json.loads(line) for line in (tmp_path / "dflash2" / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2] and all(r["train/loss"] > 0 for r in train)
    val = [r for r in records if "val/loss" in r][-1]
    assert val["val/loss"] > 0
    # Slot 0 holds the anchor under z-lab labels: full blocks are counted over slots 1..B-1, so E[L] exists.
    assert val["val/full_blocks"] > 0 and math.isfinite(val["val/expected_len"])
    summary = json.loads((tmp_path / "dflash2" / "run" / "summary.json").read_text())
    assert summary["val_metrics"]["val/expected_len"] == val["val/expected_len"]
    saved = load_file(str(tmp_path / "dflash2" / "run" / "drafter" / "drafter.safetensors"))
    assert saved["candidate_selector.successor_codebook"].shape == (512, 64)
    # lr 1e-30 (below every weight's rounding step): the backbone is the DFlash's, the convolutions the identity.
    for name, tensor in dflash.items():
        assert torch.equal(saved[name], tensor), name
    base = saved["layers.0.attention_conv.base_kernel"]
    assert torch.equal(base[:, 0], torch.ones_like(base[:, 0])) and float(base[:, 1:].abs().max()) < 1e-20
    config = json.loads((tmp_path / "dflash2" / "run" / "drafter" / "drafter_config.json").read_text())
    assert config["kind"] == "dflash2" and config["drafter"]["selector_top_k"] == 8
