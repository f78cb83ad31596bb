"""The flex BlockMask built from packed-batch metadata: tile by tile equal to ``create_block_mask`` over the dense
rule on random packings (both packing orders, block sizes above and below the tile), flex attention equal to SDPA
with the dense mask, the order it relies on enforced, and its memory at 32K-token shapes far below a
queries x keys tensor (measured in a subprocess)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from deepspec_train.models.qwen3_layers import attend
from deepspec_train.packing.attention_mask import dense_mask, flex_block_mask, num_keys, packed_mask_mod
from deepspec_train.packing.packer import build_packed_batch
from deepspec_train.packing.plans import FIRST_FIT, IN_ORDER
from tests.helpers.tiny_drafter import random_item

REPO = Path(__file__).resolve().parents[1]


def _random_batches(g: torch.Generator, block_size: int):
    """Packed batches of a few random sequences (some anchors at 0, some sequences without context)."""
    items = [random_item(int(torch.randint(3, 150, (1,), generator=g)), i, g) for i in range(int(torch.randint(1, 6, (1,), generator=g)))]
    anchors = []
    for item in items:
        length = int(item.input_ids.numel())
        count = int(torch.randint(1, min(length - 1, 25) + 1, (1,), generator=g))
        anchors.append(torch.randperm(length - 1, generator=g)[:count].sort().values)
    order = (IN_ORDER, FIRST_FIT)[int(torch.randint(0, 2, (1,), generator=g))]
    plan = order.plan(anchors, block_size, 150 + block_size + int(torch.randint(0, 400, (1,), generator=g)), None)
    return [build_packed_batch(items, groups, block_size, 0) for groups in plan]


def _reference(batch, tile: int):
    return create_block_mask(packed_mask_mod(batch), None, None, batch.num_blocks * batch.block_size,
                             num_keys(batch), device="cpu", BLOCK_SIZE=tile)


def test_the_tiles_are_create_block_masks_on_random_packings() -> None:
    g = torch.Generator().manual_seed(0)
    checked = {"partial": 0, "full": 0}
    for trial in range(20):
        block_size = [1, 3, 7, 16, 23][trial % 5]
        tile = [8, 16, 32][trial % 3]
        for batch in _random_batches(g, block_size):
            mine, reference = flex_block_mask(batch, tile_size=tile), _reference(batch, tile)
            assert mine.shape == reference.shape and mine.BLOCK_SIZE == reference.BLOCK_SIZE
            for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                         "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
                assert torch.equal(getattr(mine, name), getattr(reference, name)), (trial, name)
            checked["partial"] += int(mine.kv_num_blocks.sum())
            checked["full"] += int(mine.full_kv_num_blocks.sum())
    # Both kinds of tile occur, so both classifications were exercised.
    assert checked["partial"] > 50 and checked["full"] > 50, checked


def test_flex_attention_with_it_equals_sdpa_with_the_dense_mask() -> None:
    g = torch.Generator().manual_seed(1)
    for block_size, tile in ((7, 16), (20, 16)):
        for batch in _random_batches(g, block_size)[:2]:
            dense = dense_mask(batch)
            q = torch.randn(1, 4, dense.shape[0], 16, generator=g)
            k = torch.randn(1, 2, dense.shape[1], 16, generator=g)
            v = torch.randn(1, 2, dense.shape[1], 16, generator=g)
            flex = attend(q, k, v, flex_block_mask(batch, tile_size=tile), "flex")
            torch.testing.assert_close(flex, attend(q, k, v, dense, "sdpa"), atol=1e-5, rtol=0)


def test_a_batch_out_of_order_is_refused() -> None:
    g = torch.Generator().manual_seed(2)
    items = [random_item(40, i, g) for i in range(2)]
    batch = build_packed_batch(items, IN_ORDER.plan([torch.tensor([5, 9, 20]), torch.tensor([3, 30])], 4, 10_000,
                                                    None)[0], 4, 0)
    flex_block_mask(batch)
    swapped = dataclasses.replace(batch, block_anchor=batch.block_anchor[[1, 0, 2, 3, 4]])
    with pytest.raises(ValueError, match="blocks are not sorted"):
        flex_block_mask(swapped)
    reordered = dataclasses.replace(batch, ctx_pos=batch.ctx_pos.flip(0))
    with pytest.raises(ValueError, match="context rows are not sorted"):
        flex_block_mask(reordered)


_MEASURE = r"""
import json, resource, torch
from deepspec_train.packing.attention_mask import flex_block_mask
from deepspec_train.packing.batch import PackedBatch
B = 7

def metadata_batch(seqs):
    # Only the metadata the mask reads: (length, anchors) per sequence, anchors spread over the sequence.
    ctx_seq, ctx_pos, block_seq, block_anchor = [], [], [], []
    for s, (length, count) in enumerate(seqs):
        anchors = torch.linspace(1, length - 2, count).long().unique()
        top = int(anchors.max())
        ctx_seq.append(torch.full((top,), s)); ctx_pos.append(torch.arange(top))
        block_seq.append(torch.full((anchors.numel(),), s)); block_anchor.append(anchors)
    ctx_seq, ctx_pos = torch.cat(ctx_seq), torch.cat(ctx_pos)
    block_seq, block_anchor = torch.cat(block_seq), torch.cat(block_anchor)
    slots = torch.zeros(block_seq.numel(), B, dtype=torch.long)
    return PackedBatch(torch.zeros(ctx_seq.numel(), 0), ctx_pos, ctx_seq, ctx_pos, slots, block_seq, block_anchor,
                       slots, slots, torch.zeros(0, 0), torch.arange(len(seqs)))

# Operator libraries load on first use: warm up on a small batch, so the peak below is the mask's own.
flex_block_mask(metadata_batch([(64, 8)]))
# One 32K sequence with 4,096 anchors and two 8K ones with 1,024: the 32K recipe's shapes.
batch = metadata_batch([(32768, 4096), (8192, 1024), (8192, 1024)])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mask = flex_block_mask(batch)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_delta_bytes": (after - before) * 1024, "queries": batch.num_blocks * B,
                  "keys": batch.ctx_seq.numel() + batch.num_blocks * B,
                  "tiles": int(mask.kv_indices.shape[-2] * mask.kv_indices.shape[-1]),
                  "visited": int(mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum())}))
"""


@pytest.mark.slow
def test_the_mask_at_32k_shapes_allocates_far_less_than_queries_times_keys() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True, env=env, timeout=120,
                         check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    dense_bytes = found["queries"] * found["keys"]
    assert found["queries"] == 7 * (4096 + 2 * 1024) and dense_bytes > 2.5e9
    # The peak grows by under 2% of one byte per (query, key) pair (about 20 MB against 4 GB): O(tiles), not O(Q * KV).
    assert found["peak_delta_bytes"] < dense_bytes / 50, found
    assert 0 < found["visited"] < found["tiles"] / 2, found
