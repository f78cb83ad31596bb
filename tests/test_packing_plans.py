"""Length-aware anchors and packing orders against brute force: anchor counts per length, every anchor packed once
within the budgets by both orders, first fit never more micro-batches than in order (and at least the optimum),
the step plan's chunks with a rate and first fit, and a step's gradient independent of the packing order."""

from __future__ import annotations

import itertools
import math

import torch

from deepspec_train.config.schema import PACKING_ORDER_NAMES, AnchorConfig
from deepspec_train.packing.anchor_counts import anchor_count, anchor_rate_problems
from deepspec_train.packing.anchors import sample_anchors, valid_anchor_positions
from deepspec_train.packing.packer import build_packed_batch, plan_micro_batches, split_anchors
from deepspec_train.packing.plans import FIRST_FIT, IN_ORDER, PACKING_ORDERS, first_fit_decreasing, plan_first_fit
from deepspec_train.steps.chunk_builder import ChunkBuilder
from deepspec_train.steps.chunk_plan import PackingSpec, anchor_generator, plan_chunks
from deepspec_train.training.feature_source import StepBatches
from tests.helpers.fake_tap import FakeTap
from tests.helpers.step_trainers import accumulate_step
from tests.helpers.tiny_drafter import random_item, random_loss_mask
from tests.helpers.tiny_geometry import BLOCK, MASK_ID


# ---- anchor counts ----------------------------------------------------------------------------------------------


def _reference_count(valid: int, floor: int, rate) -> int:
    """The rule as the schema comment states it, written out case by case."""
    if rate is None:
        return valid if valid < floor else floor
    proportional = int(rate * valid / 1024 + 0.5)
    wanted = floor if floor > proportional else proportional
    return valid if valid < wanted else wanted


def test_anchor_count_per_length_brute_force() -> None:
    for valid, floor, rate in itertools.product(
        [0, 1, 7, 100, 511, 4095, 4096, 4097, 8191, 16384, 32767], [1, 32, 512], [None, 0.5, 8, 128, 1000, 1024]
    ):
        assert anchor_count(valid, floor, rate) == _reference_count(valid, floor, rate), (valid, floor, rate)
    # 128 per 1K over a floor of 512 changes nothing up to 4,096 positions and is proportional beyond.
    assert [anchor_count(v, 512, 128) for v in (300, 4096, 8192, 32767)] == [300, 512, 1024, 4096]


def test_sampled_anchors_follow_the_count_and_stay_valid() -> None:
    g = torch.Generator().manual_seed(3)
    for length in (20, 300, 2000, 9000):
        mask = random_loss_mask(length, g)
        valid = valid_anchor_positions(mask)
        for rate in (None, 64.0, 300.0):
            anchors = sample_anchors(mask, 16, anchor_generator(1, 0, length), rate)
            assert anchors.numel() == anchor_count(valid.numel(), 16, rate)
            assert set(anchors.tolist()) <= set(valid.tolist())
            assert anchors.tolist() == sorted(set(anchors.tolist()))
        # Without a rate the draw is the historical one (the fingerprinted tiny runs depend on it).
        assert torch.equal(sample_anchors(mask, 16, anchor_generator(1, 0, length)),
                           sample_anchors(mask, 16, anchor_generator(1, 0, length), None))


def test_anchor_rate_rules() -> None:
    assert anchor_rate_problems(AnchorConfig(per_1k_tokens=None), 4096) == []
    assert anchor_rate_problems(AnchorConfig(num_per_sequence=512, per_1k_tokens=128), 32768) == []
    assert "never adds an anchor" in anchor_rate_problems(AnchorConfig(num_per_sequence=512, per_1k_tokens=128), 4096)[0]
    for bad in (0.0, -1.0, 1025.0, math.nan, math.inf):
        (problem,) = anchor_rate_problems(AnchorConfig(per_1k_tokens=bad), 32768)
        assert "must be in (0, 1024]" in problem


# ---- packing orders ---------------------------------------------------------------------------------------------


def test_the_orders_are_the_schema_names() -> None:
    assert tuple(PACKING_ORDERS) == PACKING_ORDER_NAMES
    assert (IN_ORDER.plan, FIRST_FIT.plan) == (plan_micro_batches, plan_first_fit)


def _random_instance(g: torch.Generator) -> tuple[list[torch.Tensor], int, int]:
    """Anchor sets of a few sequences of mixed lengths, a block size and a budget that fits any one block."""
    block = int(torch.randint(1, 8, (1,), generator=g))
    lengths = torch.randint(2, 200, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
    anchors = []
    for length in lengths:
        count = int(torch.randint(0, min(length - 1, 30) + 1, (1,), generator=g))
        anchors.append(torch.randperm(length - 1, generator=g)[:count].sort().values)
    budget = 200 + block + int(torch.randint(0, 300, (1,), generator=g))
    return anchors, block, budget


def _check_plan(plan, anchors, block: int, budget: int, max_sequences) -> None:
    seen = {i: [] for i in range(len(anchors))}
    for groups in plan:
        assert groups, "an empty micro-batch"
        assert sum(g.cost(block) for g in groups) <= budget
        assert max_sequences is None or len(groups) <= max_sequences
        for g in groups:
            seen[g.item].extend(g.anchors.tolist())
    # Every anchor exactly once, and each sequence cut into the groups split_anchors makes.
    for i, item_anchors in enumerate(anchors):
        assert sorted(seen[i]) == sorted(item_anchors.tolist())
        planned = sorted(g.anchors.tolist() for groups in plan for g in groups if g.item == i)
        expected = [] if item_anchors.numel() == 0 else split_anchors(i, item_anchors, block, budget)
        assert planned == sorted(g.anchors.tolist() for g in expected)


def test_both_orders_pack_every_anchor_once_within_the_budgets_and_first_fit_never_needs_more() -> None:
    g = torch.Generator().manual_seed(0)
    fewer = 0
    for _ in range(300):
        anchors, block, budget = _random_instance(g)
        max_sequences = [None, 1, 2, 3][int(torch.randint(0, 4, (1,), generator=g))]
        in_order = plan_micro_batches(anchors, block, budget, max_sequences)
        first_fit = plan_first_fit(anchors, block, budget, max_sequences)
        _check_plan(in_order, anchors, block, budget, max_sequences)
        _check_plan(first_fit, anchors, block, budget, max_sequences)
        assert len(first_fit) <= len(in_order)
        fewer += len(first_fit) < len(in_order)
        # Deterministic: the same instance gives the same plan.
        again = plan_first_fit(anchors, block, budget, max_sequences)
        assert [[(x.item, x.anchors.tolist()) for x in gs] for gs in again] == \
            [[(x.item, x.anchors.tolist()) for x in gs] for gs in first_fit]
    assert fewer > 30, fewer


def _optimum(costs: list[int], budget: int) -> int:
    """The fewest bins holding ``costs`` (brute force over assignments; small instances only)."""
    best = len(costs)
    for assignment in itertools.product(range(len(costs)), repeat=len(costs)):
        if assignment[0] != 0 or max(assignment) + 1 >= best:
            continue
        loads = [0] * len(costs)
        for cost, bin_index in zip(costs, assignment):
            loads[bin_index] += cost
        if max(loads) <= budget:
            best = max(assignment) + 1
    return best


def test_first_fit_against_the_optimum_on_small_instances() -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(40):
        # Sequences of one block each, with one anchor: a group's cost is anchor + 1 at block size 1.
        costs = torch.randint(1, 10, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        anchors = [torch.tensor([c - 1]) for c in costs]
        budget = 10
        optimum = _optimum(costs, budget)
        ffd = len(first_fit_decreasing(anchors, 1, budget))
        # First fit decreasing's bound, 11/9 OPT + 6/9, and never under the optimum.
        assert optimum <= len(plan_first_fit(anchors, 1, budget)) <= len(plan_micro_batches(anchors, 1, budget))
        assert optimum <= ffd <= 11 / 9 * optimum + 6 / 9


def test_first_fit_falls_back_where_decreasing_order_loses() -> None:
    # Costs 3, 2, 2, 3, 2, 2 in a budget of 7: in order fills two micro-batches exactly; decreasing order puts
    # both 3s together and needs three.
    anchors = [torch.tensor([c - 1]) for c in (3, 2, 2, 3, 2, 2)]
    assert len(first_fit_decreasing(anchors, 1, 7)) == 3
    assert len(plan_micro_batches(anchors, 1, 7)) == 2
    assert plan_first_fit(anchors, 1, 7) == plan_micro_batches(anchors, 1, 7)


# ---- the step plan and the gradient -----------------------------------------------------------------------------


def _rows(count: int, seed: int) -> list[dict]:
    """Sequences of 10-160 tokens, supervised after their first fifth."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        length = int(torch.randint(10, 161, (1,), generator=g))
        mask = [0] * (length // 5) + [1] * (length - length // 5)
        rows.append({"input_ids": torch.randint(0, 90, (length,), generator=g).tolist(), "loss_mask": mask,
                     "sample_id": i})
    return rows


def test_chunk_plans_with_a_rate_and_first_fit_cover_the_anchors_and_count_the_built_labels() -> None:
    spec = PackingSpec(block_size=4, num_anchors=4, token_budget=300, mask_token_id=99, chunk_sequences=6,
                       anchors_per_1k_tokens=160.0, order=FIRST_FIT)
    rows = _rows(12, 2)
    chunks = plan_chunks(rows, spec, seed=5, epoch=1)
    builder = ChunkBuilder(FakeTap(), spec, "cpu")
    in_order_batches = 0
    for chunk in chunks:
        for item, row in enumerate(chunk.rows):
            mask = torch.as_tensor(row["loss_mask"], dtype=torch.bool)
            valid = valid_anchor_positions(mask).numel()
            assert chunk.anchors[item].numel() == anchor_count(valid, 4, 160.0)
        _check_plan(chunk.groups, chunk.anchors, 4, 300, None)
        in_order_batches += len(plan_micro_batches(chunk.anchors, 4, 300))
        batches = builder.build(chunk)
        assert [b.num_supervised for b in batches] == chunk.supervised
        recount = StepBatches.of(batches).slot_counts
        assert recount.keys() == chunk.slot_counts.keys()
        assert all(torch.equal(recount[k], chunk.slot_counts[k]) for k in recount)
    assert sum(len(chunk.groups) for chunk in chunks) < in_order_batches


def test_a_steps_gradient_does_not_depend_on_the_packing_order() -> None:
    g = torch.Generator().manual_seed(4)
    items = [random_item(length, i, g) for i, length in enumerate((70, 30, 55, 18, 64, 41))]
    anchors = [sample_anchors(item.loss_mask, 9, g) for item in items]
    budget = 120
    plans = {order.name: order.plan(anchors, BLOCK, budget, None) for order in (IN_ORDER, FIRST_FIT)}
    assert len(plans["first_fit"]) < len(plans["in_order"])
    results = {
        name: accumulate_step([build_packed_batch(items, groups, BLOCK, MASK_ID) for groups in plan])
        for name, plan in plans.items()
    }
    (loss_a, grads_a), (loss_b, grads_b) = results.values()
    assert math.isclose(loss_a, loss_b, rel_tol=1e-6)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert any(float(a.abs().max()) > 0 for a in grads_a)
