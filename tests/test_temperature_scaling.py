"""Sequential temperature scaling: recovers known temperatures, each choice is the brute-force argmin of its
objective given the frozen earlier temperatures, earlier positions never depend on later ones, and invalid
slots are ignored."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from deepspec_train.calibration.temperature_scaling import (
    calibrated_confidences,
    cumulative_survival,
    default_grid,
    sequential_temperature_scaling,
)
from deepspec_train.metrics.calibration import ece

TRUE_T = [1.8, 0.6, 2.5, 1.0]


def _synthetic(n: int, seed: int, true_t=TRUE_T) -> tuple[np.ndarray, np.ndarray]:
    """Logits whose true conditional acceptance is ``sigmoid(z_k / T_k)``; realised cumulative survival."""
    rng = np.random.default_rng(seed)
    k = len(true_t)
    z = rng.normal(loc=np.linspace(2.0, 0.5, k), scale=2.0, size=(n, k))
    accepted = rng.random((n, k)) < 1.0 / (1.0 + np.exp(-z / np.asarray(true_t)))
    return z, np.cumprod(accepted, axis=1).astype(np.float64)


def _brute_force_ece(prior, z_k, s_k, t):
    probs = [p / (1.0 + math.exp(-z / t)) for p, z in zip(prior, z_k)]
    sums = [[0, 0.0, 0.0] for _ in range(10)]
    for p, o in zip(probs, s_k):
        b = min(int(p * 10), 9)
        sums[b][0] += 1
        sums[b][1] += p
        sums[b][2] += o
    return sum(abs(sp - so) for _, sp, so in sums) / len(probs)


def test_recovers_known_temperatures_and_lowers_ece():
    z, s = _synthetic(40_000, seed=0)
    result = sequential_temperature_scaling(z, s)
    for fitted, true in zip(result.temperatures, TRUE_T):
        assert abs(math.log(fitted / true)) < 0.15, (result.temperatures, TRUE_T)
    for k in range(3):  # position 4's true temperature is 1: nothing to fix there beyond what 1..3 fixed
        assert result.ece_after[k] < result.ece_before[k]
        assert result.ece_after[k] < 0.01
    # Temperature scaling is monotone in z, so rankings (AUROC) at position 1 cannot change.
    assert result.auroc_after[0] == pytest.approx(result.auroc_before[0], abs=1e-12)
    assert result.counts == [40_000] * 4
    assert len(result.summary_lines()) == 5


def test_each_temperature_is_grid_argmin_given_frozen_prefix():
    z, s = _synthetic(400, seed=1)
    grid = np.exp(np.linspace(math.log(0.1), math.log(10.0), 21))
    result = sequential_temperature_scaling(z, s, grid=grid, refine=False)
    prior = np.ones(z.shape[0])
    for k, chosen in enumerate(result.temperatures):
        objective = [_brute_force_ece(prior, z[:, k], s[:, k], float(t)) for t in grid]
        best = min(objective)
        ties = [float(t) for t, o in zip(grid, objective) if o <= best + 1e-12]
        assert chosen == min(ties, key=lambda t: abs(math.log(t)))
        assert result.ece_after[k] == pytest.approx(best, abs=1e-12)
        prior = prior / (1.0 + np.exp(-z[:, k] / chosen))


def test_refinement_never_worse_than_grid():
    z, s = _synthetic(2_000, seed=2)
    coarse = sequential_temperature_scaling(z, s, refine=False)
    refined = sequential_temperature_scaling(z, s, refine=True)
    grid = default_grid()
    assert grid[len(grid) // 2] == 1.0
    # Position 1 has the same (empty) prefix in both runs, so the refined objective can only be lower.
    assert refined.ece_after[0] <= coarse.ece_after[0] + 1e-12
    i = int(np.searchsorted(grid, coarse.temperatures[0]))
    assert grid[max(i - 1, 0)] <= refined.temperatures[0] <= grid[min(i + 1, len(grid) - 1)]


def test_sequential_freezing():
    z, s = _synthetic(5_000, seed=3)
    full = sequential_temperature_scaling(z, s)
    first_two = sequential_temperature_scaling(z[:, :2], s[:, :2])
    assert full.temperatures[:2] == first_two.temperatures
    # Scrambling everything after position 2 leaves T_1 and T_2 untouched.
    rng = np.random.default_rng(4)
    z_scrambled = z.copy()
    z_scrambled[:, 2:] = rng.normal(size=(z.shape[0], 2)) * 5.0
    s_scrambled = s.copy()
    s_scrambled[:, 2:] = 0.0
    scrambled = sequential_temperature_scaling(z_scrambled, s_scrambled)
    assert scrambled.temperatures[:2] == full.temperatures[:2]


def test_invalid_slots_are_ignored():
    z, s = _synthetic(3_000, seed=5)
    valid = np.ones_like(z, dtype=bool)
    valid[:1000, 2:] = False  # a third of the blocks have only two draft slots
    reference = sequential_temperature_scaling(z, s, valid)
    z_padded = z.copy()
    z_padded[~valid] = np.nan
    s_padded = s.copy()
    s_padded[~valid] = 1.0
    padded = sequential_temperature_scaling(torch.tensor(z_padded), torch.tensor(s_padded), torch.tensor(valid))
    assert padded.temperatures == reference.temperatures
    assert padded.counts == [3000, 3000, 2000, 2000]
    # Positions 3 and 4 are scored on the long blocks only.
    long_survival = cumulative_survival(z[1000:], padded.temperatures)
    for k in (2, 3):
        assert padded.ece_after[k] == pytest.approx(ece(long_survival[:, k], s[1000:, k]), abs=1e-12)


def test_rejects_malformed_inputs():
    z = np.zeros((3, 2))
    with pytest.raises(ValueError, match="cumulative"):
        sequential_temperature_scaling(z, np.array([[0.0, 1.0], [1, 1], [1, 0]]))
    with pytest.raises(ValueError, match="prefix"):
        sequential_temperature_scaling(z, np.zeros((3, 2)), valid=np.array([[0, 1], [1, 1], [1, 1]]))


def test_helpers():
    z = np.array([[0.0, 2.0], [-1.0, 40.0]])
    t = [2.0, 0.5]
    conf = calibrated_confidences(z, t)
    assert conf == pytest.approx(1.0 / (1.0 + np.exp(-z / np.array(t))))
    assert cumulative_survival(z, t) == pytest.approx(np.cumprod(conf, axis=1))
