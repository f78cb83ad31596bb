"""Anchors, labels, packing and attention masks: brute-force references, packing invariance, no leakage."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepspec_train.models.qwen3_layers import attend
from deepspec_train.packing.anchors import block_labels, sample_anchors, valid_anchor_positions
from deepspec_train.packing.attention_mask import dense_mask, flex_block_mask
from deepspec_train.packing.batch import IGNORE_INDEX
from deepspec_train.packing.packer import (
    SequenceItem,
    needed_positions,
    pack_sequences,
    plan_micro_batches,
)
from tests.helpers.tiny_geometry import BLOCK, MASK_ID
from tests.helpers.tiny_drafter import random_item, random_loss_mask, tiny_drafter


def _items_and_anchors(seed: int, lengths=(40, 23, 57, 31), num_anchors: int = 6):
    g = torch.Generator().manual_seed(seed)
    items = [random_item(n, i + 100, g) for i, n in enumerate(lengths)]
    anchors = [sample_anchors(it.loss_mask, num_anchors, g) for it in items]
    return items, anchors


def _outputs_by_block(model, batches, items, attention="sdpa"):
    """(sample_id, anchor) -> final-normed block states, across micro-batches."""
    found = {}
    with torch.no_grad():
        for batch in batches:
            hidden = model.backbone(batch, attention)
            for b in range(batch.num_blocks):
                key = (int(batch.sample_ids[batch.block_seq[b]]), int(batch.block_anchor[b]))
                found[key] = hidden[b]
    return found


# ---- anchors and labels -------------------------------------------------------------------------------------


def test_valid_anchor_positions_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        mask = random_loss_mask(int(torch.randint(2, 60, (1,), generator=g)), g)
        expected = [a for a in range(len(mask) - 1) if mask[a] and mask[a + 1]]
        assert valid_anchor_positions(mask).tolist() == expected


def test_sample_anchors_valid_unique_sorted():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        mask = random_loss_mask(80, g)
        valid = set(valid_anchor_positions(mask).tolist())
        anchors = sample_anchors(mask, 7, g)
        assert anchors.numel() == min(7, len(valid))
        assert set(anchors.tolist()) <= valid
        assert anchors.tolist() == sorted(set(anchors.tolist()))
    mask = torch.tensor([0, 1, 1, 1, 0], dtype=torch.bool)
    assert sample_anchors(mask, 10, g).tolist() == [1, 2]


def test_sample_anchors_is_deterministic_per_generator():
    mask = torch.ones(200, dtype=torch.bool)
    a = sample_anchors(mask, 16, torch.Generator().manual_seed(5))
    b = sample_anchors(mask, 16, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def _reference_labels(ids, mask, anchor, block, convention):
    labels, targets = [IGNORE_INDEX] * block, [-1] * block
    for k in range(block):
        predicted = anchor + k + 1 if convention == "dspark" else anchor + k
        if convention == "zlab" and k == 0:
            continue
        if predicted >= len(ids) or not all(mask[anchor + 1 : predicted + 1]):
            break
        labels[k], targets[k] = int(ids[predicted]), predicted - 1
    return labels, targets


@pytest.mark.parametrize("convention", ["dspark", "zlab"])
def test_block_labels_brute_force(convention):
    g = torch.Generator().manual_seed(2)
    for _ in range(15):
        item = random_item(int(torch.randint(3, 50, (1,), generator=g)), 0, g)
        anchors = valid_anchor_positions(item.loss_mask)
        if anchors.numel() == 0:
            continue
        labels, targets = block_labels(item.input_ids, item.loss_mask, anchors, 6, convention)
        for row, a in enumerate(anchors.tolist()):
            ref_labels, ref_targets = _reference_labels(item.input_ids, item.loss_mask, a, 6, convention)
            assert labels[row].tolist() == ref_labels
            assert targets[row].tolist() == ref_targets


def test_label_conventions_on_a_known_sequence():
    ids = torch.arange(10, 20)
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    labels, targets = block_labels(ids, mask, torch.tensor([2, 8]), 4, "dspark")
    assert labels.tolist() == [[13, 14, 15, -100], [19, -100, -100, -100]]
    assert targets.tolist() == [[2, 3, 4, -1], [8, -1, -1, -1]]
    labels, targets = block_labels(ids, mask, torch.tensor([2, 8]), 4, "zlab")
    assert labels.tolist() == [[-100, 13, 14, 15], [-100, 19, -100, -100]]
    assert targets.tolist() == [[-1, 2, 3, 4], [-1, 8, -1, -1]]


# ---- packing ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [60, 90, 400])
def test_plan_respects_budget_and_covers_every_anchor(budget):
    items, anchors = _items_and_anchors(3)
    plan = plan_micro_batches(anchors, BLOCK, budget)
    seen = {i: [] for i in range(len(items))}
    for groups in plan:
        assert sum(g.cost(BLOCK) for g in groups) <= budget
        for g in groups:
            seen[g.item].extend(g.anchors.tolist())
    assert all(seen[i] == anchors[i].tolist() for i in seen)


def test_split_sequence_carries_only_needed_context():
    items, anchors = _items_and_anchors(4, lengths=(80,), num_anchors=12)
    batches = pack_sequences(items, anchors, BLOCK, 90, MASK_ID)
    assert len(batches) > 1
    for batch in batches:
        assert batch.ctx_features.shape[0] + batch.num_blocks * BLOCK <= 90
        for seq in range(batch.sample_ids.numel()):
            ctx_pos = batch.ctx_pos[batch.ctx_seq == seq]
            assert ctx_pos.tolist() == list(range(int(batch.block_anchor[batch.block_seq == seq].max())))


def test_block_larger_than_budget_is_an_error():
    items, anchors = _items_and_anchors(5, lengths=(60,))
    with pytest.raises(ValueError, match="token_budget"):
        pack_sequences(items, [anchors[0].new_tensor([50])], BLOCK, 50, MASK_ID)


def test_max_sequences_limits_packed_sequences():
    items, anchors = _items_and_anchors(6)
    for batch in pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID, max_sequences=2):
        assert batch.sample_ids.numel() <= 2


@pytest.mark.parametrize("convention", ["dspark", "zlab"])
def test_packed_batch_fields_brute_force(convention):
    items, anchors = _items_and_anchors(7)
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID, convention)
    hidden_rows = []
    for b in range(batch.num_blocks):
        item = items[int(batch.sample_ids[batch.block_seq[b]]) - 100]
        ids, a = item.input_ids, int(batch.block_anchor[b])
        assert batch.block_input[b].tolist() == [int(ids[a])] + [MASK_ID] * (BLOCK - 1)
        assert batch.block_prev[b].tolist() == [int(ids[p]) if p < len(ids) else MASK_ID for p in range(a, a + BLOCK)]
        labels, targets = _reference_labels(ids, item.loss_mask, a, BLOCK, convention)
        assert batch.labels[b].tolist() == labels
        hidden_rows += [item.final_hidden[t] for t in targets if t >= 0]
    assert torch.equal(batch.target_hidden, torch.stack(hidden_rows))
    for j in range(batch.ctx_seq.numel()):
        item = items[int(batch.sample_ids[batch.ctx_seq[j]]) - 100]
        assert torch.equal(batch.ctx_features[j], item.ctx_features[batch.ctx_pos[j]])
        assert batch.ctx_tokens[j] == item.input_ids[batch.ctx_pos[j]]


def test_callable_sources_are_asked_only_for_needed_positions():
    items, anchors = _items_and_anchors(8)
    requested = {}

    def recording(item_index, table, kind):
        def fetch(positions):
            requested.setdefault((item_index, kind), set()).update(positions.tolist())
            return table[positions]

        return fetch

    lazy = [
        dataclasses.replace(
            it, ctx_features=recording(i, it.ctx_features, "ctx"), final_hidden=recording(i, it.final_hidden, "fin")
        )
        for i, it in enumerate(items)
    ]
    (eager,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID)
    (batch,) = pack_sequences(lazy, anchors, BLOCK, 10_000, MASK_ID)
    assert all(torch.equal(x, y) for x, y in zip(eager.tensors().values(), batch.tensors().values()))
    for i, it in enumerate(items):
        ctx_needed, hidden_needed = needed_positions(it.input_ids, it.loss_mask, anchors[i], BLOCK)
        assert requested.get((i, "ctx"), set()) <= set(ctx_needed.tolist())
        assert requested[(i, "fin")] == set(hidden_needed.tolist())


# ---- attention masks ----------------------------------------------------------------------------------------


def test_dense_mask_brute_force():
    items, anchors = _items_and_anchors(9)
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID)
    mask = dense_mask(batch)
    num_ctx = batch.ctx_seq.numel()
    assert mask.shape == (batch.num_blocks * BLOCK, num_ctx + batch.num_blocks * BLOCK)
    for q in range(mask.shape[0]):
        b = q // BLOCK
        for kv in range(mask.shape[1]):
            if kv < num_ctx:
                expected = batch.ctx_seq[kv] == batch.block_seq[b] and batch.ctx_pos[kv] < batch.block_anchor[b]
            else:
                expected = (kv - num_ctx) // BLOCK == b
            assert bool(mask[q, kv]) == bool(expected)


@pytest.mark.parametrize("seed", [10, 11])
def test_flex_matches_sdpa_on_random_packings(seed):
    items, anchors = _items_and_anchors(seed, lengths=(70, 45, 90, 33, 61), num_anchors=9)
    for batch in pack_sequences(items, anchors, BLOCK, 200, MASK_ID):
        block_mask = flex_block_mask(batch, tile_size=16)
        dense = dense_mask(batch)
        # Every allowed (query, key) pair lies in a tile the BlockMask visits, and some tiles are skipped.
        tiles = block_mask.to_dense()[0, 0].bool()
        covered = tiles.repeat_interleave(16, 0).repeat_interleave(16, 1)[: dense.shape[0], : dense.shape[1]]
        assert not (dense & ~covered).any()
        assert not tiles.all()
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(1, 4, dense.shape[0], 16, generator=g)
        k = torch.randn(1, 2, dense.shape[1], 16, generator=g)
        v = torch.randn(1, 2, dense.shape[1], 16, generator=g)
        flex_out = attend(q, k, v, block_mask, "flex")
        torch.testing.assert_close(flex_out, attend(q, k, v, dense, "sdpa"), atol=1e-5, rtol=0)


def test_drafter_flex_path_matches_sdpa_path():
    model = tiny_drafter("dspark")
    items, anchors = _items_and_anchors(12)
    batches = pack_sequences(items, anchors, BLOCK, 120, MASK_ID)
    sdpa = _outputs_by_block(model, batches, items, "sdpa")
    flex = _outputs_by_block(model, batches, items, "flex")
    for key in sdpa:
        torch.testing.assert_close(flex[key], sdpa[key], atol=1e-5, rtol=0)


def test_block_at_position_zero_has_no_context_rows():
    g = torch.Generator().manual_seed(16)
    item = dataclasses.replace(random_item(12, 0, g), loss_mask=torch.ones(12, dtype=torch.bool))
    (batch,) = pack_sequences([item], [torch.tensor([0])], BLOCK, 100, MASK_ID)
    assert batch.ctx_seq.numel() == 0
    model = tiny_drafter("dspark")
    with torch.no_grad():
        sdpa, flex = model.backbone(batch, "sdpa"), model.backbone(batch, "flex")
    assert torch.isfinite(sdpa).all()
    torch.testing.assert_close(flex, sdpa, atol=1e-5, rtol=0)


# ---- (a) packing invariance, (b) no leakage, (c) no future context ------------------------------------------


@pytest.mark.parametrize("kind", ["dspark", "dflash"])
def test_packed_outputs_equal_unpacked(kind):
    model = tiny_drafter(kind)
    items, anchors = _items_and_anchors(13)
    packed = _outputs_by_block(model, pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID), items)
    split = _outputs_by_block(model, pack_sequences(items, anchors, BLOCK, 90, MASK_ID), items)
    alone = {}
    for item, item_anchors in zip(items, anchors):
        for a in item_anchors.tolist():
            single = pack_sequences([item], [torch.tensor([a])], BLOCK, 10_000, MASK_ID)
            alone.update(_outputs_by_block(model, single, [item]))
    assert packed.keys() == alone.keys() == split.keys()
    for key in alone:
        assert (packed[key] - alone[key]).abs().max() <= 1e-5
        assert (split[key] - alone[key]).abs().max() <= 1e-5


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_no_leakage_between_sequences(attention):
    model = tiny_drafter("dspark")
    items, anchors = _items_and_anchors(14)
    g = torch.Generator().manual_seed(99)
    changed = list(items)
    victim = items[1]
    changed[1] = SequenceItem(
        input_ids=torch.randint(0, MASK_ID, victim.input_ids.shape, generator=g),
        loss_mask=victim.loss_mask,
        ctx_features=torch.randn(victim.ctx_features.shape, generator=g),
        final_hidden=victim.final_hidden,
        sample_id=victim.sample_id,
    )
    before = _outputs_by_block(model, pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID), items, attention)
    after = _outputs_by_block(model, pack_sequences(changed, anchors, BLOCK, 10_000, MASK_ID), changed, attention)
    for (sample_id, anchor), hidden in before.items():
        if sample_id == victim.sample_id:
            assert not torch.equal(hidden, after[(sample_id, anchor)])
        else:
            assert torch.equal(hidden, after[(sample_id, anchor)])


def test_block_never_sees_context_at_or_after_its_anchor():
    model = tiny_drafter("dspark")
    items, anchors = _items_and_anchors(15)
    target = 2
    base = _outputs_by_block(model, pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID), items)
    for a in anchors[target].tolist():
        for start, should_change in ((a, False), (max(a - 1, 0), a > 0)):
            features = items[target].ctx_features.clone()
            features[start:] += 10.0
            perturbed = list(items)
            perturbed[target] = dataclasses.replace(items[target], ctx_features=features)
            out = _outputs_by_block(model, pack_sequences(perturbed, anchors, BLOCK, 10_000, MASK_ID), perturbed)
            key = (items[target].sample_id, a)
            assert torch.equal(out[key], base[key]) != should_change
