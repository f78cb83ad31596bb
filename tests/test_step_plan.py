"""The step plan against brute force: every sequence of an epoch exactly once, drafter ranks disjoint, positions
and checkpoint data positions as a step-by-step walk would give them, chunk plans that cover each sequence's
anchors and count what the chunk builder labels, and a resumed colocated source that yields the batches of an
uninterrupted one."""

from __future__ import annotations

import itertools

import pytest
import torch

from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.steps.chunk_builder import ChunkBuilder
from deepspec_train.steps.chunk_plan import PackingSpec, anchor_generator
from deepspec_train.steps.plan import StepPlan, data_state, next_step_of, step_position
from deepspec_train.training.feature_source import InProcessFeatureSource, StepBatches
from tests.helpers.fake_tap import FakeTap

PACKING = PackingSpec(block_size=4, num_anchors=3, token_budget=48, mask_token_id=99, chunk_sequences=2)


def _rows(count: int, seed: int = 0) -> list[dict]:
    """Sequences of 12-30 tokens whose second half is supervised (an assistant answer)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        length = int(torch.randint(12, 31, (1,), generator=g))
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        rows.append({"input_ids": torch.randint(0, 90, (length,), generator=g).tolist(), "loss_mask": mask,
                     "sample_id": i})
    return rows


def _plans(num_sequences: int, per_step: int, world_size: int, shuffle: bool) -> list[StepPlan]:
    rows = _rows(num_sequences)
    return [StepPlan(rows, per_step, 5, PACKING, rank, world_size, shuffle) for rank in range(world_size)]


@pytest.mark.parametrize("num_sequences,per_step,world_size,shuffle", [
    (10, 3, 1, True), (10, 3, 2, True), (17, 5, 3, True), (12, 4, 4, False), (9, 9, 2, False), (11, 2, 3, True),
])
def test_every_sequence_of_an_epoch_once_and_ranks_disjoint(num_sequences, per_step, world_size, shuffle) -> None:
    plans = _plans(num_sequences, per_step, world_size, shuffle)
    steps_per_epoch = num_sequences // per_step
    for epoch in range(3):
        seen: list[int] = []
        for step in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
            shares = [plan.sequence_indices(step) for plan in plans]
            # Rank r holds the step's r-th, (r + D)-th, ... sequence: interleaving the shares rebuilds the step.
            merged = [i for column in itertools.zip_longest(*shares) for i in column if i is not None]
            assert len(merged) == per_step
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
            for a, b in itertools.combinations(shares, 2):
                assert not set(a) & set(b)
            seen += merged
        assert len(seen) == len(set(seen)) == steps_per_epoch * per_step
        assert set(seen) <= set(range(num_sequences))
        if not shuffle:
            assert seen == list(range(steps_per_epoch * per_step))
    if shuffle and num_sequences > per_step:
        # Epochs visit the data in different orders.
        assert len({tuple(plans[0].sequence_indices(e * steps_per_epoch)) for e in range(4)}) > 1


def test_positions_and_checkpoint_states_follow_a_step_by_step_walk() -> None:
    steps_per_epoch = 4
    # The walk the colocated source used to take: roll over to the next epoch only when a step is asked for.
    epoch, in_epoch = 0, 0
    for step in range(3 * steps_per_epoch + 2):
        state = {"epoch": epoch, "step_in_epoch": in_epoch}
        assert data_state(step, steps_per_epoch) == state
        assert next_step_of(state, steps_per_epoch) == step
        if in_epoch >= steps_per_epoch:
            epoch, in_epoch = epoch + 1, 0
        position = step_position(step, steps_per_epoch)
        assert (position.epoch, position.step_in_epoch) == (epoch, in_epoch)
        in_epoch += 1


def test_chunk_plans_cover_the_anchors_and_count_the_built_labels() -> None:
    plan = _plans(13, 5, 2, True)[1]
    builder = ChunkBuilder(FakeTap(), PACKING, "cpu")
    for step in (0, 1, 2, 5):
        chunks = plan.chunks(step)
        rows = [row for chunk in chunks for row in chunk.rows]
        assert [row["sample_id"] for row in rows] == plan.sequence_indices(step)
        assert all(len(chunk.rows) <= PACKING.chunk_sequences for chunk in chunks)
        epoch = plan.position(step).epoch
        for chunk in chunks:
            for item, row in enumerate(chunk.rows):
                mask = torch.as_tensor(row["loss_mask"], dtype=torch.bool)
                expected = sample_anchors(mask, PACKING.num_anchors, anchor_generator(5, epoch, row["sample_id"]))
                assert torch.equal(chunk.anchors[item], expected)
                packed = [g.anchors for groups in chunk.groups for g in groups if g.item == item]
                assert torch.equal(torch.cat(packed) if packed else expected, expected)
            batches = builder.build(chunk)
            assert [b.num_supervised for b in batches] == chunk.supervised
            recount = StepBatches.of(batches).slot_counts
            assert recount.keys() == chunk.slot_counts.keys()
            assert all(torch.equal(recount[k], chunk.slot_counts[k]) for k in recount)
        # Pure: asking again, after other steps, gives the same plan.
        again = plan.chunks(step)
        assert [[g.anchors.tolist() for gs in c.groups for g in gs] for c in again] == \
            [[g.anchors.tolist() for gs in c.groups for g in gs] for c in chunks]


def _flat(step: StepBatches) -> list[dict[str, torch.Tensor]]:
    return [batch.tensors() for batch in step.batches]


def test_a_resumed_source_yields_the_uninterrupted_batches() -> None:
    plan = _plans(10, 3, 2, True)[0]
    builder = ChunkBuilder(FakeTap(), PACKING, "cpu")
    uninterrupted = [_flat(step) for step in itertools.islice(InProcessFeatureSource(plan, builder), 8)]
    for stop in (1, 3, 6):
        first = InProcessFeatureSource(plan, builder)
        list(itertools.islice(first, stop))
        resumed = InProcessFeatureSource(plan, builder)
        resumed.load_state_dict(first.state_dict())
        for step in itertools.islice(resumed, 8 - stop):
            expected = uninterrupted[resumed.next_step - 1]
            got = _flat(step)
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
