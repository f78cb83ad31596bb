"""The GPU path (skipped without CUDA): the same code as on CPU with NCCL, bf16 and compiled flex attention.

- compiled flex attention (the BlockMask path training takes on GPU) equals the dense-mask SDPA path on packed
  batches, for the parallel drafter and for EAGLE-3's step masks;
- a colocated bf16 run trains a few steps on CUDA (flex attention, bf16 autocast) and writes its drafter;
- a streamed run over NCCL (1 target + 1 drafter, one GPU each) trains the same per-step losses as the
  colocated run (fp32), which needs two GPUs.
"""

from __future__ import annotations

import json

import pytest
import torch

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.jobs.run import run_training
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from tests.helpers.tiny_geometry import BLOCK, MASK_ID
from tests.helpers.tiny_drafter import random_item, tiny_drafter
from tests.helpers.streaming_world import recipe_overrides, run_ranks, step_losses

pytestmark = pytest.mark.gpu


def _packed(seed: int):
    g = torch.Generator().manual_seed(seed)
    items = [random_item(n, i, g) for i, n in enumerate((40, 23, 57, 31))]
    anchors = [sample_anchors(item.loss_mask, 6, g) for item in items]
    return pack_sequences(items, anchors, BLOCK, 120, MASK_ID)


def test_compiled_flex_attention_matches_sdpa_on_cuda() -> None:
    model = tiny_drafter("dspark").cuda()
    with torch.no_grad():
        for batch in _packed(0):
            batch = batch.to("cuda")
            sdpa = model.backbone(batch, "sdpa")
            flex = model.backbone(batch, "flex", compiled=True)
            torch.testing.assert_close(flex, sdpa, atol=2e-5, rtol=0)


def test_colocated_bf16_run_on_cuda(streaming_world, tmp_path) -> None:
    out = tmp_path / "run"
    overrides = recipe_overrides(
        streaming_world, out, **{"train.mixed_precision": "bf16", "target.dtype": "bfloat16"}
    )
    summary = run_training(load_recipe(overrides[0].split("=", 1)[1], overrides[1:]))
    assert summary.steps == 4
    losses = step_losses(out)
    assert sorted(losses) == [1, 2, 3, 4] and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val/expected_len" in r] == [2, 4]
    assert (out / "drafter" / "drafter.safetensors").is_file()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL streaming needs one GPU per rank (2 GPUs)")
def test_nccl_streamed_run_matches_colocated(streaming_world, tmp_path) -> None:
    streamed, colocated = tmp_path / "streamed", tmp_path / "colocated"
    run_ranks(recipe_overrides(streaming_world, streamed, **{"topology.target_workers": 1}), 2, tmp_path / "logs")
    overrides = recipe_overrides(streaming_world, colocated)
    run_training(load_recipe(overrides[0].split("=", 1)[1], overrides[1:]))
    expected, got = step_losses(colocated), step_losses(streamed)
    assert sorted(got) == [1, 2, 3, 4]
    for step, loss in expected.items():
        assert got[step] == pytest.approx(loss, rel=1e-4), step
