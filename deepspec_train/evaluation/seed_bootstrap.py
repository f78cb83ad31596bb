"""A two-level bootstrap for tau ratios over training seeds and prompts together.

A drafter kind trained with several seeds is several drafters; the question a table answers is about the kind,
so its interval must carry the spread between training seeds as well as the spread between prompts. Training
seed ``s`` gave one drafter of each kind (same data order and budget within the seed), and every drafter decoded
the same prompts, so the design is paired on both levels. One replicate draws the training seeds with replacement
and, per category, the prompts with replacement (one draw shared by every drawn seed: the prompts are crossed with
the seeds, not nested in them), and recomputes each kind's pooled tau (``sum(emitted) / sum(rounds)`` over the
drawn seeds and prompts, as ``deepspec eval`` pools rounds). Ratios, their geometric mean over categories and the
reported fields are ``paired_bootstrap``'s; with one training seed this is that module's prompt bootstrap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from deepspec_train.evaluation.paired_bootstrap import PromptTotals, RatioEstimate, ratio_estimates

# totals[training seed][category][kind] -> that seed's drafter's per-prompt totals
SeedTotals = Sequence[Mapping[str, Mapping[str, PromptTotals]]]


def _stacked(totals: SeedTotals, category: str, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """``[seeds, prompts]`` arrays of emitted tokens and rounds."""
    emitted = np.stack([seed[category][kind].emitted for seed in totals])
    rounds = np.stack([seed[category][kind].rounds for seed in totals])
    return emitted, rounds


def pooled_tau(totals: SeedTotals) -> dict[str, dict[str, float]]:
    """``{category: {kind: tau}}`` pooled over every training seed and prompt."""
    out: dict[str, dict[str, float]] = {}
    for category in sorted(totals[0]):
        out[category] = {}
        for kind in totals[0][category]:
            emitted, rounds = _stacked(totals, category, kind)
            out[category][kind] = float(emitted.sum() / rounds.sum())
    return out


def seed_and_prompt_ratios(totals: SeedTotals, pairs: Sequence[tuple[str, str]], replicates: int = 2000,
                           seed: int = 0, level: float = 0.95) -> dict[tuple[str, str], dict[str, RatioEstimate]]:
    """``{(a, b): {category: estimate, ..., "geomean": estimate}}`` of pooled ``tau_a / tau_b`` (see the module
    docstring); every seed's categories must hold the same prompts for every kind."""
    if replicates < 2:
        raise ValueError(f"replicates must be >= 2, got {replicates}")
    if not totals or not totals[0]:
        raise ValueError("no training seed or category to bootstrap")
    categories = sorted(totals[0])
    if any(sorted(t) != categories for t in totals):
        raise ValueError("every training seed must cover the same categories")
    rng = np.random.default_rng(seed)
    # Prompts first, in paired_bootstrap's order: with one training seed the replicates are exactly its.
    sizes = {c: totals[0][c][pairs[0][0]].emitted.size for c in categories}
    prompt_draws = {c: rng.integers(0, sizes[c], size=(replicates, sizes[c])) for c in categories}
    seed_draw = rng.integers(0, len(totals), size=(replicates, len(totals)))

    def replicate_taus(category: str, kind: str) -> tuple[float, np.ndarray]:
        emitted, rounds = _stacked(totals, category, kind)
        prompts = prompt_draws[category]
        # [R, seeds drawn, prompts drawn]: rows of the drawn seeds, columns of the drawn prompts.
        pick_e = emitted[seed_draw[:, :, None], prompts[:, None, :]]
        pick_r = rounds[seed_draw[:, :, None], prompts[:, None, :]]
        return float(emitted.sum() / rounds.sum()), pick_e.sum(axis=(1, 2)) / pick_r.sum(axis=(1, 2))

    return ratio_estimates(pairs, categories, replicate_taus, level)
