"""Calibration and ranking quality of the confidence head: ECE, reliability curve, Brier score and AUROC.

The confidence head predicts the conditional acceptance of a draft slot, and its training target ``c*`` is soft
(a probability in [0, 1], not a 0/1 event). ECE, the reliability curve and the Brier score are defined for soft
outcomes directly: they compare mean predicted probability with mean outcome. AUROC needs binary labels, so
``auroc_soft`` thresholds the soft target first, and ``auroc_expected`` scores against the outcomes the soft
target would draw (each row a positive with weight ``c*``, a negative with weight ``1 - c*``). Inputs are anything
``numpy.asarray`` accepts (CPU tensors included); computation is in float64.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike


class ReliabilityCurve(NamedTuple):
    """Per-bin statistics over ``n_bins`` equal-width bins of [0, 1]; empty bins have NaN means and count 0."""

    bin_centers: np.ndarray
    mean_prob: np.ndarray
    mean_outcome: np.ndarray
    counts: np.ndarray


def _flat(x: ArrayLike) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _paired(probs: ArrayLike, outcomes: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p, o = _flat(probs), _flat(outcomes)
    if p.shape != o.shape:
        raise ValueError(f"probs and outcomes differ in size: {p.shape[0]} vs {o.shape[0]}")
    return p, o


def reliability_curve(probs: ArrayLike, outcomes: ArrayLike, n_bins: int = 10) -> ReliabilityCurve:
    """Bin predictions into ``[i/n, (i+1)/n)`` (the last bin also takes 1.0) and average probability and outcome."""
    p, o = _paired(probs, outcomes)
    bins = np.clip(np.floor(p * n_bins).astype(np.int64), 0, n_bins - 1)
    counts = np.bincount(bins, minlength=n_bins)
    prob_sums = np.bincount(bins, weights=p, minlength=n_bins)
    outcome_sums = np.bincount(bins, weights=o, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_prob = np.where(counts > 0, prob_sums / counts, np.nan)
        mean_outcome = np.where(counts > 0, outcome_sums / counts, np.nan)
    centers = (np.arange(n_bins) + 0.5) / n_bins
    return ReliabilityCurve(centers, mean_prob, mean_outcome, counts)


def ece(probs: ArrayLike, outcomes: ArrayLike, n_bins: int = 10) -> float:
    """Expected calibration error: ``sum_b (n_b / N) |mean prob_b - mean outcome_b|`` over equal-width bins.

    Outcomes may be soft (in [0, 1]). NaN for empty input.
    """
    curve = reliability_curve(probs, outcomes, n_bins)
    total = curve.counts.sum()
    if total == 0:
        return math.nan
    filled = curve.counts > 0
    gaps = np.abs(curve.mean_prob[filled] - curve.mean_outcome[filled])
    return float((curve.counts[filled] * gaps).sum() / total)


def brier(probs: ArrayLike, outcomes: ArrayLike) -> float:
    """Mean squared difference between predicted probability and (possibly soft) outcome; NaN for empty input."""
    p, o = _paired(probs, outcomes)
    if p.size == 0:
        return math.nan
    return float(np.mean((p - o) ** 2))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, tied values sharing the mean of the ranks they span."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    last_rank = np.cumsum(counts)
    return (last_rank - (counts - 1) / 2.0)[inverse]


def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve: the probability that a random positive outscores a random negative, ties
    counting one half (Mann-Whitney U with average ranks). NaN when either class is absent."""
    s, y = _paired(scores, labels)
    positive = y > 0.5
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    rank_sum = _average_ranks(s)[positive].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def auroc_soft(scores: ArrayLike, targets: ArrayLike, threshold: float = 0.5) -> float:
    """AUROC against soft targets binarised as ``target >= threshold``.

    For the confidence head this asks: does the predicted confidence rank the slots whose analytic acceptance
    ``c*`` is at least ``threshold`` above those where it is lower? It measures ranking only; calibration is ECE's
    job.
    """
    t = _flat(targets)
    return auroc(scores, (t >= threshold).astype(np.float64))


def auroc_expected(scores: ArrayLike, probs: ArrayLike) -> float:
    """AUROC against outcomes drawn from ``probs``, in expectation over pairs: the probability that row ``i``
    outscores row ``j != i`` (ties one half), pairs weighted by ``p_i (1 - p_j)``, the chance that ``i`` is the
    positive and ``j`` the negative. Scored with ``c*`` itself this is the ceiling of any predictor of teacher-forced
    acceptance; NaN when every ``p`` is 0 or every one is 1."""
    s, p = _paired(scores, probs)
    order = np.argsort(s, kind="stable")
    s, p = s[order], p[order]
    q = 1.0 - p
    _, start, counts = np.unique(s, return_index=True, return_counts=True)
    below = np.concatenate([[0.0], np.cumsum(q)])
    group_q = np.add.reduceat(q, start)
    # For each row: the negative weight of strictly lower scores, plus half its tie group's less its own.
    tie_of_row = np.repeat(np.arange(start.size), counts)
    lower = below[start][tie_of_row]
    ties = group_q[tie_of_row] - q
    numerator = float((p * (lower + 0.5 * ties)).sum())
    denominator = float(p.sum() * q.sum() - (p * q).sum())
    return numerator / denominator if denominator > 0 else math.nan
