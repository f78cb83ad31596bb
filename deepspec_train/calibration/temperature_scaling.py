"""Sequential temperature scaling (STS) of the confidence head, fitted on a validation suite after training.

The confidence head outputs a logit ``z_k`` per draft position ``k``; ``sigmoid(z_k / T_k)`` is the calibrated
probability that position ``k`` is accepted given that positions ``1..k-1`` were. The scheduler multiplies these
into cumulative survival ``S_k = prod_{i<=k} sigmoid(z_i / T_i)``, so what must be calibrated is ``S_k`` itself
against the realised survival (1 if positions ``1..k`` were all accepted). STS fits left to right: ``T_1``
minimises the ECE of ``S_1`` against realised survival at 1 and is frozen; then ``T_2`` minimises the ECE of
``S_2`` given the frozen ``T_1``; and so on. A later position never changes an earlier temperature.

One-dimensional search per position: a log-spaced grid over ``[0.05, 20]`` (odd size, so 1.0 is on it), ties
(objective within ``_TIE_TOL``) going to the temperature closest to 1 in log distance (the identity when the data
cannot tell), then golden-section refinement in ``log T`` between the argmin's grid neighbours. Binned ECE is
piecewise smooth in ``T``, not unimodal, so the refinement is a local search that only replaces the grid choice
when it finds a strictly lower objective.

Inputs, per validation block ``n`` and position ``k`` (0-based columns): ``logits [N, K]``; ``survived [N, K]``
(1 if slots ``1..k+1`` were all accepted, so non-increasing along a row); ``valid [N, K]`` (the block has at
least ``k+1`` draft slots, so this row counts for position ``k``; valid slots form a prefix of each row). Run
through ``deepspec calibrate``; the fitted temperatures go into the exported DSpark config.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
from numpy.typing import ArrayLike

from deepspec_train.metrics.calibration import auroc, brier, ece

T_MIN = 0.05
T_MAX = 20.0
_GRID_SIZE = 81
_GOLDEN_STEPS = 40
_TIE_TOL = 1e-12
_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass
class CalibrationResult:
    """Fitted temperatures and per-position quality of cumulative survival, before (``T = 1``) and after."""

    temperatures: list[float]
    counts: list[int]
    ece_before: list[float]
    ece_after: list[float]
    auroc_before: list[float]
    auroc_after: list[float]
    brier_before: list[float]
    brier_after: list[float]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary_lines(self) -> list[str]:
        """A fixed-width table, one line per position, for the ``calibrate`` command's report."""
        lines = ["pos      n      T  ECE before  ECE after  AUROC before  AUROC after  Brier before  Brier after"]
        for k, t in enumerate(self.temperatures):
            lines.append(
                f"{k + 1:>3} {self.counts[k]:>6} {t:>6.3f}  {self.ece_before[k]:>10.4f} {self.ece_after[k]:>10.4f}"
                f"  {self.auroc_before[k]:>12.4f} {self.auroc_after[k]:>12.4f}"
                f"  {self.brier_before[k]:>12.4f} {self.brier_after[k]:>11.4f}"
            )
        return lines


def default_grid() -> np.ndarray:
    """``_GRID_SIZE`` log-spaced temperatures from ``T_MIN`` to ``T_MAX``; the middle one is exactly 1.0."""
    half_width = math.log(T_MAX / T_MIN) / 2.0
    center = math.log(math.sqrt(T_MIN * T_MAX))
    return np.exp(center + np.linspace(-half_width, half_width, _GRID_SIZE))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # The tanh form never overflows, unlike 1 / (1 + exp(-x)) for large negative x.
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def calibrated_confidences(logits: ArrayLike, temperatures: ArrayLike) -> np.ndarray:
    """Conditional confidences ``sigmoid(z_k / T_k)`` for ``logits [..., K]`` and ``temperatures [K]``."""
    return _sigmoid(_as_array(logits) / _as_array(temperatures))


def cumulative_survival(logits: ArrayLike, temperatures: ArrayLike) -> np.ndarray:
    """``S_k = prod_{i<=k} sigmoid(z_i / T_i)`` along the last dimension of ``logits [..., K]``."""
    return np.cumprod(calibrated_confidences(logits, temperatures), axis=-1)


def _as_array(x: ArrayLike) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _validated(
    logits: ArrayLike, survived: ArrayLike, valid: Optional[ArrayLike]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    z = _as_array(logits)
    s = _as_array(survived)
    if z.ndim != 2 or s.shape != z.shape:
        raise ValueError(f"logits and survived must both be [N, K]; got {z.shape} and {s.shape}")
    v = np.ones(z.shape, dtype=bool) if valid is None else np.asarray(_as_array(valid), dtype=bool)
    if v.shape != z.shape:
        raise ValueError(f"valid must be [N, K] like logits; got {v.shape}")
    if bool((v[:, 1:] & ~v[:, :-1]).any()):
        raise ValueError("valid positions must form a prefix of each row (a block has slots 1..m)")
    # Invalid slots may hold anything (padding, NaN); neutral values keep the arithmetic finite.
    z = np.where(v, z, 0.0)
    s = np.where(v, s, 0.0)
    if bool(((s < 0) | (s > 1)).any()):
        raise ValueError("survived must lie in [0, 1]")
    if bool((v[:, 1:] & (s[:, 1:] > s[:, :-1])).any()):
        raise ValueError("survived must be cumulative (non-increasing along a row): got a conditional acceptance?")
    return z, s, v


def _closest_to_one(temperatures: np.ndarray, objective: np.ndarray) -> float:
    near_best = objective <= objective.min() + _TIE_TOL
    candidates = temperatures[near_best]
    return float(candidates[np.argmin(np.abs(np.log(candidates)))])


def _golden_section(f: Callable[[float], float], low: float, high: float) -> tuple[float, float]:
    """Best point seen while golden-section-searching ``f`` over ``[low, high]``: ``(x, f(x))``."""
    a, b = low, high
    c, d = b - _INV_PHI * (b - a), a + _INV_PHI * (b - a)
    fc, fd = f(c), f(d)
    best_x, best_f = (c, fc) if fc <= fd else (d, fd)
    for _ in range(_GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _INV_PHI * (b - a)
            fc = f(c)
            x, fx = c, fc
        else:
            a, c, fc = c, d, fd
            d = a + _INV_PHI * (b - a)
            fd = f(d)
            x, fx = d, fd
        if fx < best_f:
            best_x, best_f = x, fx
    return best_x, best_f


def position_objective(
    prior_survival: np.ndarray, logits_k: np.ndarray, survived_k: np.ndarray, n_bins: int
) -> Callable[[float], float]:
    """``T -> ECE(prior_survival * sigmoid(z_k / T), survived_k)`` over the rows valid at position ``k``;
    ``prior_survival`` is the frozen calibrated survival through position ``k - 1`` (ones for the first)."""

    def objective(temperature: float) -> float:
        return ece(prior_survival * _sigmoid(logits_k / temperature), survived_k, n_bins)

    return objective


def fit_temperature(objective: Callable[[float], float], grid: np.ndarray, refine: bool = True) -> float:
    """Grid argmin of ``objective`` (ties to the temperature closest to 1), optionally refined by golden-section
    search in ``log T`` between the argmin's grid neighbours."""
    values = np.array([objective(float(t)) for t in grid])
    best_t = _closest_to_one(grid, values)
    if not refine or grid.size < 2:
        return best_t
    i = int(np.searchsorted(grid, best_t))
    low, high = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, grid.size - 1)])
    log_t, value = _golden_section(lambda u: objective(math.exp(u)), low, high)
    return math.exp(log_t) if value < objective(best_t) - _TIE_TOL else best_t


def _scores(probs: np.ndarray, outcomes: np.ndarray, n_bins: int) -> tuple[float, float, float]:
    return ece(probs, outcomes, n_bins), auroc(probs, outcomes), brier(probs, outcomes)


def sequential_temperature_scaling(
    logits: ArrayLike,
    survived: ArrayLike,
    valid: Optional[ArrayLike] = None,
    grid: Optional[ArrayLike] = None,
    n_bins: int = 10,
    refine: bool = True,
) -> CalibrationResult:
    """Fit ``T_1..T_K`` left to right (see the module docstring) and report ECE, AUROC and Brier of cumulative
    survival per position, before (all ``T = 1``) and after. A position with no valid row keeps ``T = 1`` and
    NaN scores."""
    z, s, v = _validated(logits, survived, valid)
    grid_values = np.sort(_as_array(default_grid() if grid is None else grid).reshape(-1))
    if grid_values.size == 0 or bool((grid_values <= 0).any()):
        raise ValueError("the temperature grid must be non-empty and positive")
    num_positions = z.shape[1]
    raw_survival = np.cumprod(_sigmoid(z), axis=1)
    temperatures: list[float] = []
    counts: list[int] = []
    before: list[tuple[float, float, float]] = []
    after: list[tuple[float, float, float]] = []
    prior = np.ones(z.shape[0])
    for k in range(num_positions):
        rows = v[:, k]
        counts.append(int(rows.sum()))
        if counts[-1] == 0:
            temperatures.append(1.0)
        else:
            objective = position_objective(prior[rows], z[rows, k], s[rows, k], n_bins)
            temperatures.append(fit_temperature(objective, grid_values, refine))
        prior = prior * _sigmoid(z[:, k] / temperatures[-1])
        before.append(_scores(raw_survival[rows, k], s[rows, k], n_bins))
        after.append(_scores(prior[rows], s[rows, k], n_bins))
    ece_before, auroc_before, brier_before = (list(column) for column in zip(*before)) if before else ([], [], [])
    ece_after, auroc_after, brier_after = (list(column) for column in zip(*after)) if after else ([], [], [])
    return CalibrationResult(
        temperatures=temperatures,
        counts=counts,
        ece_before=ece_before,
        ece_after=ece_after,
        auroc_before=auroc_before,
        auroc_after=auroc_after,
        brier_before=brier_before,
        brier_after=brier_after,
    )
