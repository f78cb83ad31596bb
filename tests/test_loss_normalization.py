"""Per-sequence loss normalisation: the definition, and invariance to packing, accumulation and drafter ranks.

The step loss under ``loss.normalizer=sequence`` must be ``(1/S) * sum_s [sum_{i in s} w_i term_i / W_s]``
however the step's sequences are packed into micro-batches (a long sequence split over several), accumulated, or
spread over drafter ranks (two real gloo processes here); per-token normalisation is checked the same way.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepspec_train.config.schema import LossConfig, RecipeConfig, TrainConfig
from deepspec_train.losses.normalization import (
    merge_weight_sums, row_normalizers, row_sequence_ids, sequence_weight_sums,
)
from deepspec_train.training.feature_source import StepBatches
from deepspec_train.losses.position_weights import decay_weights
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from deepspec_train.training.distributed import DistContext
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.loss_normalizers import step_normalizers
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, VOCAB
from tests.helpers.tiny_drafter import drafter_config, random_item, tiny_drafter

NUM_SEQUENCES = 6
LENGTHS = [40, 23, 61, 17, 35, 52]


def _recipe(normalizer: str) -> RecipeConfig:
    return RecipeConfig(
        drafter=drafter_config("dspark"),
        loss=LossConfig(normalizer=normalizer, distance="l1", chunk_size=16),
        train=TrainConfig(global_batch_sequences=NUM_SEQUENCES),
    )


def _problem() -> tuple[list, list, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    items = [random_item(n, sample_id=100 + i, generator=g) for i, n in enumerate(LENGTHS)]
    anchors = [sample_anchors(item.loss_mask, 6, torch.Generator().manual_seed(i)) for i, item in enumerate(items)]
    head = torch.randn(VOCAB, HIDDEN, generator=g) * 0.5
    return items, anchors, head


def _local_ctx() -> DistContext:
    return DistContext(0, 1, 0, torch.device("cpu"), None)


def _step(cfg: RecipeConfig, indices: list[int], token_budget: int, ctx: DistContext) -> tuple[float, dict]:
    """Loss and gradients of one step over the sequences ``indices`` (this rank's share), packed by budget."""
    items, anchors, head = _problem()
    model = tiny_drafter("dspark", seed=0).train()
    batches = pack_sequences([items[i] for i in indices], [anchors[i] for i in indices], BLOCK, token_budget, MASK_ID)
    drafter_loss = DrafterLoss.for_recipe(cfg, head, "sdpa")
    normalizer = step_normalizers(StepBatches.of(batches), drafter_loss, model, ctx)
    total = 0.0
    for batch in batches:
        loss = drafter_loss(model, batch, normalizer.rows(batch)).loss.loss
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return total, grads


def test_sequence_loss_is_the_mean_of_per_sequence_weighted_means() -> None:
    cfg = _recipe("sequence")
    loss, _ = _step(cfg, list(range(NUM_SEQUENCES)), 4096, _local_ctx())
    items, anchors, head = _problem()
    model = tiny_drafter("dspark", seed=0).train()
    drafter_loss = DrafterLoss.for_recipe(cfg, head, "sdpa")
    expected = 0.0
    for item, item_anchors in zip(items, anchors):
        (batch,) = pack_sequences([item], [item_anchors], BLOCK, 4096, MASK_ID)
        if batch.num_supervised == 0:
            continue
        weighted_sum = float(drafter_loss(model, batch, 1.0).loss.loss.detach())
        slots = torch.arange(BLOCK).expand_as(batch.supervised_mask)[batch.supervised_mask]
        expected += weighted_sum / float(decay_weights(slots, cfg.loss.gamma_decay).sum())
    assert loss == pytest.approx(expected / NUM_SEQUENCES, rel=1e-5)


@pytest.mark.parametrize("normalizer", ["sequence", "token"])
def test_packing_and_accumulation_do_not_change_the_step(normalizer: str) -> None:
    cfg = _recipe(normalizer)
    whole_loss, whole = _step(cfg, list(range(NUM_SEQUENCES)), 4096, _local_ctx())
    # A budget this small splits the longer sequences' anchors over several micro-batches.
    split_loss, split = _step(cfg, list(range(NUM_SEQUENCES)), 80, _local_ctx())
    assert split_loss == pytest.approx(whole_loss, rel=1e-5)
    assert whole.keys() == split.keys()
    for name, grad in whole.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_split_sequences_have_one_denominator() -> None:
    items, anchors, _ = _problem()
    batches = pack_sequences(items, anchors, BLOCK, 80, MASK_ID)
    ids = [row_sequence_ids(b) for b in batches]
    assert sum(len(set(i.tolist())) for i in ids) > NUM_SEQUENCES, "the budget should split some sequence"
    weights = [decay_weights(torch.arange(BLOCK).expand_as(b.supervised_mask)[b.supervised_mask], 4.0)
               for b in batches]
    sums = sequence_weight_sums(StepBatches.of(batches).slot_counts, decay_weights(torch.arange(BLOCK), 4.0))
    # Brute force: every supervised row's weight added to its sequence.
    expected: dict[int, float] = {}
    for row_ids, row_weights in zip(ids, weights):
        for key, weight in zip(row_ids.tolist(), row_weights.tolist()):
            expected[key] = expected.get(key, 0.0) + weight
    assert sorted(sums) == sorted(expected) == [100 + i for i in range(NUM_SEQUENCES) if anchors[i].numel()]
    assert all(sums[key] == pytest.approx(expected[key]) for key in expected)
    rows = torch.cat([row_normalizers(i, sums, NUM_SEQUENCES) for i in ids])
    keys = torch.cat(ids)
    for key in sums:
        assert torch.all(rows[keys == key] == NUM_SEQUENCES * sums[key])
    assert merge_weight_sums([{1: 1.0, 2: 2.0}, {2: 0.5}]) == {1: 1.0, 2: 2.5}
    with pytest.raises(ValueError, match="no positive weight"):
        row_normalizers(torch.tensor([7]), sums, NUM_SEQUENCES)


def _rank_worker(rank: int, world_size: int, store_path: str, result_path: str, normalizer: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size)
    try:
        ctx = DistContext(rank, world_size, 0, torch.device("cpu"), dist.group.WORLD)
        # The feature source's rule: each rank takes a strided share of the step's sequences.
        loss, grads = _step(_recipe(normalizer), list(range(NUM_SEQUENCES))[rank::world_size], 80, ctx)
        for grad in grads.values():
            dist.all_reduce(grad)
        summed = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(summed)
        if rank == 0:
            torch.save({"loss": float(summed), "grads": grads}, result_path)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("normalizer", ["sequence", "token"])
def test_two_drafter_ranks_equal_one(tmp_path, normalizer: str) -> None:
    result = tmp_path / "result.pt"
    mp.spawn(_rank_worker, args=(2, str(tmp_path / "store"), str(result), normalizer), nprocs=2, join=True)
    reduced = torch.load(result)
    loss, grads = _step(_recipe(normalizer), list(range(NUM_SEQUENCES)), 4096, _local_ctx())
    assert reduced["loss"] == pytest.approx(loss, rel=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(reduced["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")

