"""Paired bootstrap over prompts for ratios of tau (tokens per verification round) between two drafters.

Every drafter decodes the same prompts, so the drafters' per-prompt results are paired: one bootstrap replicate
draws the prompts of each category with replacement once and recomputes every drafter's tau on that same draw.
A category's tau is a ratio of sums, ``sum(emitted) / sum(rounds)`` over its prompts (so long answers weigh by
their rounds, as in ``deepspec eval``'s report), and the tau ratio of drafters ``a`` and ``b`` is
``tau_a / tau_b``. Across categories the summary is the geometric mean of the per-category ratios, computed per
replicate from that replicate's category draws (categories are resampled independently: they are separate
suites).

Reported per ratio: the point estimate on the full sample, the standard error (standard deviation of the
replicates) and a percentile interval. Draws come from a seeded numpy generator, so a run is reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class RatioEstimate:
    """A ratio with its bootstrap standard error and ``level`` percentile interval ``[low, high]``."""

    value: float
    se: float
    low: float
    high: float

    def excludes_one(self) -> bool:
        return self.low > 1.0 or self.high < 1.0

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "se": self.se, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class PromptTotals:
    """Per-prompt sums of one drafter in one category, aligned across drafters by prompt: ``emitted[n]`` tokens
    over ``rounds[n]`` verification rounds."""

    emitted: np.ndarray
    rounds: np.ndarray

    def tau(self, index: np.ndarray | slice = slice(None)) -> np.ndarray | float:
        """tau of the prompts at ``index``: ``[R, n]`` indices give ``[R]`` replicate values."""
        emitted, rounds = self.emitted[index], self.rounds[index]
        return emitted.sum(axis=-1) / rounds.sum(axis=-1)


def prompt_totals(emitted: Sequence[float], rounds: Sequence[float]) -> PromptTotals:
    e, r = np.asarray(emitted, dtype=np.float64), np.asarray(rounds, dtype=np.float64)
    if e.shape != r.shape or e.ndim != 1 or e.size == 0:
        raise ValueError(f"emitted {e.shape} and rounds {r.shape} must be equal non-empty 1-d arrays")
    if bool((r <= 0).any()):
        raise ValueError("every prompt needs at least one verification round")
    return PromptTotals(e, r)


def estimate_from_replicates(point: float, replicates: np.ndarray, level: float) -> RatioEstimate:
    """``point`` with the standard deviation and ``level`` percentile interval of its bootstrap ``replicates``."""
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(replicates, [alpha, 1.0 - alpha])
    return RatioEstimate(float(point), float(replicates.std(ddof=1)), float(low), float(high))


# (category, drafter) -> that drafter's tau in the category on the full sample, and on each bootstrap replicate.
TauReplicates = Callable[[str, str], tuple[float, np.ndarray]]


def ratio_estimates(pairs: Sequence[tuple[str, str]], categories: Sequence[str], taus: TauReplicates,
                    level: float) -> dict[tuple[str, str], dict[str, RatioEstimate]]:
    """``{(a, b): {category: estimate, ..., "geomean": estimate}}`` of ``tau_a / tau_b`` from every drafter's
    point and replicate taus (``taus``): per category, and their geometric mean over the categories, computed per
    replicate. Both bootstraps report through it (this module's over prompts, ``seed_bootstrap``'s over seeds
    and prompts)."""
    out: dict[tuple[str, str], dict[str, RatioEstimate]] = {}
    for a, b in pairs:
        per_category: dict[str, RatioEstimate] = {}
        log_points, log_replicates = [], []
        for category in categories:
            (point_a, reps_a), (point_b, reps_b) = taus(category, a), taus(category, b)
            point, reps = point_a / point_b, reps_a / reps_b
            per_category[category] = estimate_from_replicates(point, reps, level)
            log_points.append(math.log(point))
            log_replicates.append(np.log(reps))
        geomean = math.exp(sum(log_points) / len(log_points))
        per_category["geomean"] = estimate_from_replicates(geomean, np.exp(np.mean(log_replicates, axis=0)), level)
        out[(a, b)] = per_category
    return out


def bootstrap_tau_ratios(
    totals: Mapping[str, Mapping[str, PromptTotals]],
    pairs: Sequence[tuple[str, str]],
    replicates: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[tuple[str, str], dict[str, RatioEstimate]]:
    """``{(a, b): {category: estimate, ..., "geomean": estimate}}`` of ``tau_a / tau_b``.

    ``totals[category][drafter]`` holds that drafter's per-prompt totals; within a category every drafter must
    have the same number of prompts (the same prompts, in the same order).
    """
    draws = _prompt_draws(totals, replicates, seed)
    return ratio_estimates(pairs, sorted(totals), lambda c, k: (totals[c][k].tau(), totals[c][k].tau(draws[c])), level)


def bootstrap_tau(
    totals: Mapping[str, Mapping[str, PromptTotals]],
    replicates: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, dict[str, RatioEstimate]]:
    """``{category: {drafter: estimate}}`` of each drafter's own tau, resampling prompts with the same draws as
    ``bootstrap_tau_ratios`` (same ``seed``): the interval a bar of tau carries. Drafters' intervals overlap more
    than their paired ratio's interval suggests; the ratio is the comparison."""
    draws = _prompt_draws(totals, replicates, seed)
    return {c: {name: estimate_from_replicates(float(t.tau()), t.tau(draws[c]), level)
                for name, t in by_drafter.items()} for c, by_drafter in totals.items()}


def _prompt_draws(
    totals: Mapping[str, Mapping[str, PromptTotals]], replicates: int, seed: int
) -> dict[str, np.ndarray]:
    """Per category (in sorted order, so one seed gives the same draws to every caller), ``[replicates, n]``
    prompt indices drawn with replacement."""
    if replicates < 2:
        raise ValueError(f"replicates must be >= 2, got {replicates}")
    if not totals:
        raise ValueError("no category to bootstrap")
    rng = np.random.default_rng(seed)
    draws: dict[str, np.ndarray] = {}
    for category in sorted(totals):
        sizes = {name: t.emitted.size for name, t in totals[category].items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"category {category}: drafters have different prompt counts {sizes}")
        n = next(iter(sizes.values()))
        draws[category] = rng.integers(0, n, size=(replicates, n))
    return draws


def bootstrap_mean(values_per_prompt: Sequence[np.ndarray], replicates: int = 2000, seed: int = 0,
                   level: float = 0.95) -> RatioEstimate:
    """Mean over all rounds of a per-round quantity (e.g. draft seconds), resampling prompts: ``values_per_prompt``
    holds each prompt's per-round values."""
    sums = np.array([float(np.sum(v)) for v in values_per_prompt])
    counts = np.array([float(len(v)) for v in values_per_prompt])
    if counts.size == 0 or counts.sum() == 0:
        raise ValueError("no round to average")
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, counts.size, size=(replicates, counts.size))
    reps = sums[draw].sum(axis=1) / np.maximum(counts[draw].sum(axis=1), 1.0)
    return estimate_from_replicates(sums.sum() / counts.sum(), reps, level)
