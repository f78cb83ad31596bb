"""The greedy prefix scheduler against brute force over every allocation, its prerequisites, its response to
load, non-anticipation, and the SPS table."""

from __future__ import annotations

import inspect
import itertools
import math
import random

import pytest

from deepspec_train.scheduling.greedy_prefix import Allocation, allocate, evaluate_allocation, greedy_path
from deepspec_train.scheduling.sps_table import SPSTable


def _random_confidences(rng: random.Random, requests: int, max_block: int) -> list[list[float]]:
    rows = []
    for _ in range(requests):
        block = rng.randint(0, max_block)
        # Include exact ties, certain and hopeless slots next to ordinary ones.
        rows.append([rng.choice([1.0, 0.0, 0.5, rng.random(), rng.random() ** 0.2]) for _ in range(block)])
    return rows


def _concave_table(rng: random.Random, max_batch: int) -> SPSTable:
    """Positive, non-increasing, concave SPS sampled at random knots covering 0..max_batch."""
    start = rng.uniform(50.0, 200.0)
    linear = rng.uniform(0.0, 0.3) * start / max_batch
    quadratic = rng.uniform(0.0, 0.5) * start / max_batch**2
    knots = sorted({0, max_batch, *rng.sample(range(1, max_batch), k=min(3, max_batch - 1))})
    return SPSTable(knots, [start - linear * b - quadratic * b * b for b in knots])


def _arbitrary_table(rng: random.Random, max_batch: int) -> SPSTable:
    knots = list(range(max_batch + 1))
    return SPSTable(knots, [rng.uniform(10.0, 100.0) for _ in knots])


def _theta(lengths, confidences, sps, base):
    tau, batch = 0.0, 0
    for j, row in zip(lengths, confidences):
        tau += 1.0 + sum(math.prod(row[:i]) for i in range(1, j + 1))
        batch += base + j
    return tau * sps.sps(batch)


def _brute_force_best(confidences, sps, base):
    choices = itertools.product(*[range(len(row) + 1) for row in confidences])
    return max(_theta(lengths, confidences, sps, base) for lengths in choices)


@pytest.mark.parametrize("seed", range(60))
def test_greedy_with_early_stop_is_optimal_for_concave_profiles(seed):
    rng = random.Random(seed)
    base = rng.choice([1, 1, 2])
    confidences = _random_confidences(rng, rng.randint(1, 4), 3)
    sps = _concave_table(rng, sum(base + len(row) for row in confidences) + 1)
    plan = allocate(confidences, sps, base)
    best = _brute_force_best(confidences, sps, base)
    assert plan.throughput == pytest.approx(best, rel=1e-12)
    assert plan.throughput == pytest.approx(_theta(plan.lengths, confidences, sps, base), rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_best_point_of_greedy_path_is_optimal_for_any_profile(seed):
    rng = random.Random(1000 + seed)
    base = rng.choice([0, 1, 2])
    confidences = _random_confidences(rng, rng.randint(1, 4), 3)
    sps = _arbitrary_table(rng, sum(base + len(row) for row in confidences) + 1)
    path = greedy_path(confidences, sps, base)
    assert max(path.throughputs) == pytest.approx(_brute_force_best(confidences, sps, base), rel=1e-12)


def test_early_stop_can_miss_the_optimum_for_a_convex_step():
    # SPS halves for the first drafted token and then stays flat: the first admission loses, the second would win.
    sps = SPSTable([1, 2, 3], [100.0, 50.0, 50.0])
    plan = allocate([[0.9, 0.9]], sps)
    assert plan.lengths == [0] and plan.throughput == pytest.approx(100.0)
    assert _brute_force_best([[0.9, 0.9]], sps, 1) == pytest.approx(2.71 * 50.0)


@pytest.mark.parametrize("seed", range(20))
def test_prerequisites_hold_along_the_whole_path(seed):
    rng = random.Random(2000 + seed)
    confidences = _random_confidences(rng, 6, 6)
    path = greedy_path(confidences, SPSTable([0, 100], [100.0, 50.0]))
    assert sorted(path.order) == [(r, j) for r, row in enumerate(confidences) for j in range(1, len(row) + 1)]
    seen: set[tuple[int, int]] = set()
    for request, position in path.order:
        assert position == 1 or (request, position - 1) in seen
        seen.add((request, position))


def test_worked_example_from_the_explainer():
    # Requests A (0.90, then 0.70 cumulative) and B (0.80, then 0.30): the queue is A1, B1, A2, B2.
    path = greedy_path([[0.9, 0.7 / 0.9], [0.8, 0.3 / 0.8]], SPSTable([0, 10], [100.0, 90.0]))
    assert path.order == [(0, 1), (1, 1), (0, 2), (1, 2)]


@pytest.mark.parametrize("seed", range(10))
def test_more_requests_never_lengthen_existing_ones(seed):
    rng = random.Random(3000 + seed)
    pool = [[rng.random() ** 0.3 for _ in range(7)] for _ in range(40)]
    sps = SPSTable([0, 64, 160, 320], [100.0, 90.0, 70.0, 30.0])
    previous = None
    for load in range(1, len(pool) + 1):
        lengths = allocate(pool[:load], sps).lengths
        if previous is not None:
            assert all(now <= before for now, before in zip(lengths, previous))
        previous = lengths


def test_budget_per_request_shrinks_as_identical_load_rises():
    sps = SPSTable([0, 64, 160, 320], [100.0, 90.0, 70.0, 30.0])
    confidences = [0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5]
    per_request = [sum(allocate([confidences] * load, sps).lengths) / load for load in range(1, 41)]
    assert all(b <= a for a, b in zip(per_request, per_request[1:]))
    assert per_request[0] > per_request[-1]


def test_non_anticipation():
    # The only inputs are pre-verification confidences, the speed profile and the base cost.
    assert list(inspect.signature(allocate).parameters) == ["confidences", "sps", "base_tokens_per_request"]
    rng = random.Random(7)
    sps = SPSTable([0, 40], [100.0, 40.0])
    for _ in range(20):
        confidences = _random_confidences(rng, 5, 5)
        plan = allocate(confidences, sps)
        # Lowering the confidence of any slot the plan did not admit changes nothing: rejected candidates are
        # never reconsidered, and admitted ones never depended on them.
        lowered = [row[:j] + [c * 0.5 for c in row[j:]] for row, j in zip(confidences, plan.lengths)]
        assert allocate(lowered, sps).lengths == plan.lengths
        assert allocate(confidences, sps) == plan


def test_evaluate_and_edge_cases():
    sps = SPSTable([2, 4], [10.0, 5.0])
    plan = evaluate_allocation([2, 0], [[0.5, 0.5], [0.9]], sps)
    assert plan == Allocation([2, 0], 1 + 0.5 + 0.25 + 1, 4, (2.75) * 5.0)
    assert allocate([], sps).lengths == []
    assert allocate([[1.0, 1.0, 0.0]], SPSTable([0], [10.0])).lengths == [2]
    with pytest.raises(ValueError):
        allocate([[1.5]], sps)
    with pytest.raises(ValueError):
        evaluate_allocation([2], [[0.5]], sps)


def test_sps_table_interpolation_extrapolation_and_json(tmp_path):
    table = SPSTable([8, 16, 32], [100.0, 80.0, 40.0])
    assert table.sps(4) == 100.0
    assert table.sps(12) == pytest.approx(90.0)
    assert table.sps(24) == pytest.approx(60.0)
    # Beyond the profile the step time keeps its last slope: 1/40 + (1/40 - 1/80) / 16 * 16 = 3/80 s.
    assert table.sps(48) == pytest.approx(80.0 / 3.0)
    speeds = [table.sps(b) for b in range(80)]
    assert all(b <= a for a, b in zip(speeds, speeds[1:]))
    path = tmp_path / "sps.json"
    table.save(path)
    loaded = SPSTable.load(path)
    assert loaded.batch_sizes == table.batch_sizes and loaded.steps_per_s == table.steps_per_s
    with pytest.raises(ValueError):
        SPSTable([8, 8], [1.0, 1.0])
    with pytest.raises(ValueError):
        SPSTable.from_dict({"batch_sizes": [1], "steps_per_s": [1.0], "extra": 1})
