"""Drafter-quality metrics against brute-force references: calibration, acceptance accumulators, E[L], plots,
and a 2-process gloo all_reduce of the accumulators."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepspec_train.metrics.acceptance import (
    BlockLengthStats,
    PositionStats,
    block_expected_lengths,
    expected_accept_length,
    rows_to_blocks,
    slot_index_of_rows,
    tau_analytic,
)
from deepspec_train.metrics.calibration import auroc, auroc_expected, auroc_soft, brier, ece, reliability_curve
from deepspec_train.comparison.plots import plot_per_position

# ---------------------------------------------------------------- calibration


def _brute_bins(probs, outcomes, n_bins):
    bins = [[] for _ in range(n_bins)]
    for p, o in zip(probs, outcomes):
        b = n_bins - 1
        for i in range(n_bins):
            if i / n_bins <= p < (i + 1) / n_bins:
                b = i
                break
        bins[b].append((p, o))
    return bins


def _brute_ece(probs, outcomes, n_bins):
    total = 0.0
    for members in _brute_bins(probs, outcomes, n_bins):
        if members:
            mean_p = sum(p for p, _ in members) / len(members)
            mean_o = sum(o for _, o in members) / len(members)
            total += len(members) / len(probs) * abs(mean_p - mean_o)
    return total


def _brute_auroc(scores, labels):
    pairs = wins = 0.0
    for s_pos, y_pos in zip(scores, labels):
        for s_neg, y_neg in zip(scores, labels):
            if y_pos == 1 and y_neg == 0:
                pairs += 1
                wins += 1.0 if s_pos > s_neg else 0.5 if s_pos == s_neg else 0.0
    return wins / pairs


@pytest.mark.parametrize("n_bins", [1, 5, 10])
def test_ece_and_reliability_match_loops_with_soft_outcomes(n_bins):
    rng = np.random.default_rng(n_bins)
    probs = np.concatenate([rng.uniform(0, 1, 300), [0.0, 1.0, 0.5, 0.2]])
    outcomes = np.clip(probs + rng.normal(0, 0.2, probs.size), 0, 1)
    assert ece(probs, outcomes, n_bins) == pytest.approx(_brute_ece(probs, outcomes, n_bins), abs=1e-12)

    curve = reliability_curve(torch.tensor(probs), torch.tensor(outcomes), n_bins)
    for i, members in enumerate(_brute_bins(probs, outcomes, n_bins)):
        assert curve.counts[i] == len(members)
        assert curve.bin_centers[i] == pytest.approx((i + 0.5) / n_bins)
        if members:
            assert curve.mean_prob[i] == pytest.approx(np.mean([p for p, _ in members]))
            assert curve.mean_outcome[i] == pytest.approx(np.mean([o for _, o in members]))
        else:
            assert math.isnan(curve.mean_prob[i]) and math.isnan(curve.mean_outcome[i])


def test_ece_edge_cases():
    assert ece([0.05, 0.15], [0.05, 0.15], n_bins=10) == 0.0
    # Empty bins do not contribute; one bin with everything gives |mean p - mean o|.
    assert ece([0.9, 0.9, 0.9, 0.9], [1, 1, 1, 0], n_bins=10) == pytest.approx(0.15)
    assert math.isnan(ece([], []))
    with pytest.raises(ValueError):
        ece([0.1, 0.2], [1.0])


def test_brier_matches_loop():
    rng = np.random.default_rng(0)
    p, o = rng.uniform(0, 1, 50), rng.uniform(0, 1, 50)
    assert brier(p, o) == pytest.approx(sum((a - b) ** 2 for a, b in zip(p, o)) / 50)


def test_auroc_counts_pairs_with_ties():
    rng = np.random.default_rng(1)
    # Coarse integer scores make ties frequent, which is the case average ranks must get right.
    scores = rng.integers(0, 6, 80).astype(float)
    labels = (rng.uniform(0, 1, 80) < 0.3 + 0.1 * scores).astype(float)
    assert auroc(scores, labels) == pytest.approx(_brute_auroc(scores, labels), abs=1e-12)
    assert auroc([0.1, 0.2, 0.3], [0, 0, 1]) == 1.0
    assert auroc([0.3, 0.2, 0.1], [0, 0, 1]) == 0.0
    assert auroc([0.5, 0.5], [0, 1]) == 0.5
    assert math.isnan(auroc([0.1, 0.2], [1, 1]))


def test_auroc_soft_binarises_at_threshold():
    rng = np.random.default_rng(2)
    scores = rng.uniform(0, 1, 60)
    targets = np.clip(scores + rng.normal(0, 0.3, 60), 0, 1)
    for threshold in (0.3, 0.5):
        labels = [1 if t >= threshold else 0 for t in targets]
        assert auroc_soft(scores, targets, threshold) == pytest.approx(_brute_auroc(scores, labels), abs=1e-12)


def test_auroc_expected_weighs_every_ordered_pair_by_its_chance():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 5, 50).astype(float)  # frequent ties
    probs = rng.uniform(0, 1, 50)
    num = den = 0.0
    for i, j in itertools.permutations(range(50), 2):
        w = probs[i] * (1 - probs[j])
        den += w
        num += w * (1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0)
    assert auroc_expected(scores, probs) == pytest.approx(num / den, abs=1e-12)
    # Hard probabilities reduce it to the plain AUROC; a monotone map of the scores leaves it unchanged.
    labels = (probs > 0.5).astype(float)
    assert auroc_expected(scores, labels) == pytest.approx(_brute_auroc(scores, labels), abs=1e-12)
    assert auroc_expected(np.exp(scores), probs) == pytest.approx(num / den, abs=1e-12)
    # Outcomes drawn from the probabilities: the empirical AUROC averages to the expected one.
    draws = [auroc(probs, rng.uniform(0, 1, 50) < probs) for _ in range(4000)]
    assert np.mean(draws) == pytest.approx(auroc_expected(probs, probs), abs=0.01)
    assert math.isnan(auroc_expected([0.1, 0.2], [1.0, 1.0]))


# ---------------------------------------------------------------- expected acceptance length


def test_expected_accept_length_explicit_products():
    c = [0.9, 0.8, 0.5, 0.25]
    explicit = 0.9 + 0.9 * 0.8 + 0.9 * 0.8 * 0.5 + 0.9 * 0.8 * 0.5 * 0.25
    assert expected_accept_length(c) == pytest.approx(explicit)
    assert tau_analytic(c) == pytest.approx(1 + explicit)
    assert expected_accept_length([1.0] * 7) == 7.0
    assert expected_accept_length([]) == 0.0


def test_block_expected_lengths_and_row_helpers_match_loops():
    torch.manual_seed(0)
    nb, b = 6, 5
    c = torch.rand(nb, b, dtype=torch.float64)
    lengths = block_expected_lengths(c)
    for i in range(nb):
        assert lengths[i].item() == pytest.approx(expected_accept_length(c[i].tolist()))

    mask = torch.arange(b)[None, :] < torch.tensor([5, 3, 0, 5, 1, 4])[:, None]
    values = torch.arange(int(mask.sum()), dtype=torch.float64) + 1
    slots, blocks, n = [], torch.zeros(nb, b, dtype=torch.float64), 0
    for i in range(nb):
        for k in range(b):
            if mask[i, k]:
                slots.append(k)
                blocks[i, k] = values[n]
                n += 1
    assert slot_index_of_rows(mask).tolist() == slots
    assert torch.equal(rows_to_blocks(values, mask), blocks)


def _random_rows(seed, b, n_blocks=40):
    """Supervised rows of ``n_blocks`` blocks with random valid-prefix lengths, in row-major order."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, b + 1, (n_blocks,), generator=g)
    prefix[: n_blocks // 2] = b  # at least half the blocks fully supervised
    mask = torch.arange(b)[None, :] < prefix[:, None]
    ns = int(mask.sum())
    c_star = torch.rand(ns, generator=g)
    correct = (torch.rand(ns, generator=g) < c_star).float()
    conf = torch.rand(ns, generator=g)
    return mask, c_star, correct, conf


def test_position_stats_match_numpy():
    b = 4
    stats = PositionStats(b)
    all_slots, all_c, all_correct, conf_slots, conf_vals = [], [], [], [], []
    for seed in range(3):
        mask, c_star, correct, conf = _random_rows(seed, b)
        slots = slot_index_of_rows(mask)
        with_conf = seed != 1  # one micro-batch without a confidence head output
        stats.update(slots, c_star, correct.bool(), conf if with_conf else None)
        all_slots.append(slots.numpy())
        all_c.append(c_star.numpy())
        all_correct.append(correct.numpy())
        if with_conf:
            conf_slots.append(slots.numpy())
            conf_vals.append(conf.numpy())
    slots, c_np, correct_np = map(np.concatenate, (all_slots, all_c, all_correct))
    cslots, cvals = np.concatenate(conf_slots), np.concatenate(conf_vals)

    summary = stats.summary("train")
    for k in range(b):
        sel = slots == k
        assert summary[f"train/count_{k + 1}"] == sel.sum()
        assert summary[f"train/acc_{k + 1}"] == pytest.approx(correct_np[sel].mean())
        assert summary[f"train/accept_{k + 1}"] == pytest.approx(c_np[sel].mean())
        assert summary[f"train/conf_{k + 1}"] == pytest.approx(cvals[cslots == k].mean())
    assert summary["train/acc"] == pytest.approx(correct_np.mean())
    assert summary["train/accept"] == pytest.approx(c_np.mean())
    assert stats.accept_means() == pytest.approx([c_np[slots == k].mean() for k in range(b)])
    assert stats.counts() == [int((slots == k).sum()) for k in range(b)]

    stats.reset()
    assert stats.summary("train") == {}
    assert all(math.isnan(v) for v in stats.acc_means())


def test_position_stats_skips_unseen_positions():
    stats = PositionStats(3)
    stats.update(torch.tensor([0, 0]), torch.tensor([0.5, 1.0]), torch.tensor([1, 0]))
    summary = stats.summary("val")
    assert summary == {"val/acc_1": 0.5, "val/accept_1": 0.75, "val/count_1": 2.0, "val/acc": 0.5, "val/accept": 0.75}


def test_block_length_stats_brute_force_and_mean_of_products_vs_product_of_means():
    b = 5
    stats = BlockLengthStats(b)
    full_blocks = []
    for seed in range(2):
        mask, c_star, _, _ = _random_rows(seed, b)
        stats.update(c_star, mask)
        rows = c_star.tolist()
        n = 0
        for i in range(mask.shape[0]):
            length = int(mask[i].sum())
            if length == b:
                full_blocks.append(rows[n : n + b])
            n += length
    per_block = []
    for block in full_blocks:
        total = 0.0
        for j in range(b):
            prod = 1.0
            for k in range(j + 1):
                prod *= block[k]
            total += prod
        per_block.append(total)
    means = [sum(block[k] for block in full_blocks) / len(full_blocks) for k in range(b)]

    summary = stats.summary("val")
    assert summary["val/full_blocks"] == len(full_blocks)
    assert summary["val/expected_len"] == pytest.approx(sum(per_block) / len(per_block))
    assert summary["val/tau_analytic"] == pytest.approx(1 + sum(per_block) / len(per_block))
    assert summary["val/expected_len_from_means"] == pytest.approx(expected_accept_length(means))

    # Perfectly correlated slots: half the blocks always accept, half never. Mean of products = 2.5, while the
    # product of the means (0.5 each) gives only 0.5 + 0.25 + ... < 1.
    correlated = BlockLengthStats(b)
    mask = torch.ones(2, b, dtype=torch.bool)
    correlated.update(torch.tensor([1.0] * b + [0.0] * b), mask)
    out = correlated.summary("val")
    assert out["val/expected_len"] == pytest.approx(2.5)
    assert out["val/expected_len_from_means"] == pytest.approx(sum(0.5 ** (j + 1) for j in range(b)))

    assert BlockLengthStats(b).summary("val") == {"val/full_blocks": 0.0}


# ---------------------------------------------------------------- distributed


def _all_reduce_worker(rank: int, world_size: int, store_path: str, result_path: str) -> None:
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        b = 4
        mask, c_star, correct, conf = _random_rows(100 + rank, b)
        positions = PositionStats(b)
        positions.update(slot_index_of_rows(mask), c_star, correct, conf)
        lengths = BlockLengthStats(b)
        lengths.update(c_star, mask)
        positions.all_reduce()
        lengths.all_reduce()
        if rank == 0:
            torch.save({"positions": positions.summary("train"), "lengths": lengths.summary("val")}, result_path)
    finally:
        dist.destroy_process_group()


def test_all_reduce_over_two_gloo_ranks_equals_single_process(tmp_path):
    world_size, b = 2, 4
    result_path = str(tmp_path / "result.pt")
    mp.spawn(
        _all_reduce_worker, args=(world_size, str(tmp_path / "store"), result_path), nprocs=world_size, join=True
    )
    reduced = torch.load(result_path)

    positions, lengths = PositionStats(b), BlockLengthStats(b)
    for rank in range(world_size):
        mask, c_star, correct, conf = _random_rows(100 + rank, b)
        positions.update(slot_index_of_rows(mask), c_star, correct, conf)
        lengths.update(c_star, mask)
    expected = {**positions.summary("train"), **lengths.summary("val")}
    got = {**reduced["positions"], **reduced["lengths"]}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


# ---------------------------------------------------------------- plots


def _is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_per_position_plot_writes_a_png(tmp_path):
    per_position = plot_per_position(
        {"dspark": [0.9, 0.8, 0.7], "dflash": [0.85, 0.7, 0.5]}, "accept_k", tmp_path / "sub" / "accept.png"
    )
    assert _is_png(per_position)


def test_auroc_matches_pair_count_for_every_labelling():
    # Exhaustive over the 0/1 labellings of a small score set with a tie.
    scores = [0.1, 0.4, 0.4, 0.9]
    for labels in itertools.product([0, 1], repeat=4):
        if 0 < sum(labels) < 4:
            assert auroc(scores, labels) == pytest.approx(_brute_auroc(scores, labels))
