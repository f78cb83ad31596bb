"""How many anchors a sequence trains on, and the recipe rules of the anchor rate (no torch: recipe validation
imports this before anything heavy loads).

A sequence with ``valid`` valid anchor positions gets ``num_per_sequence`` anchors (all of them when it has
fewer) or, with a rate ``per_1k_tokens``, the larger of that and ``round(per_1k_tokens * valid / 1024)``, never
more than ``valid``.

Why the rate counts valid anchor positions, not tokens: only those can hold an anchor, and a long prompt with a
short answer should not get more blocks than the answer has positions to supervise; counted this way, every
supervised token is covered by about the same number of blocks whatever the sequence's length. Why
``num_anchors`` becomes a floor, not a cap: a sequence up to ``1024 * num_anchors / per_1k_tokens`` valid
positions keeps exactly the anchors it had without the rate (128 per 1K with a floor of 512 changes nothing up to
4,096 positions, DeepSpec's setting), and short sequences, which cost little, stay densely supervised.
"""

from __future__ import annotations

import math
from typing import Optional

from deepspec_train.config.schema import AnchorConfig


def anchor_count(valid: int, num_anchors: int, per_1k_tokens: Optional[float] = None) -> int:
    """Anchors of a sequence with ``valid`` valid anchor positions (see the module docstring): ``num_anchors``
    (the floor with a rate), ``round(per_1k_tokens * valid / 1024)`` (half up) when larger, at most ``valid``."""
    count = min(num_anchors, valid)
    if per_1k_tokens is not None:
        count = max(count, math.floor(per_1k_tokens * valid / 1024 + 0.5))
    return min(count, valid)


def anchor_rate_problems(anchors: AnchorConfig, max_length: int) -> list[str]:
    """Recipe rules of ``anchors.per_1k_tokens``: a rate in (0, 1024] that gives a sequence of ``max_length``
    tokens more anchors than the floor ``anchors.num_per_sequence`` (else it changes nothing, and a recipe that
    sets it means it to); one-line messages, empty when fine."""
    rate = anchors.per_1k_tokens
    if rate is None:
        return []
    if not (math.isfinite(rate) and 0 < rate <= 1024):
        return [f"anchors.per_1k_tokens = {rate!r} must be in (0, 1024] (anchors per 1,024 valid positions) or unset"]
    most = anchor_count(max_length - 1, anchors.num_per_sequence, rate)
    if most <= anchors.num_per_sequence:
        return [
            f"anchors.per_1k_tokens = {rate:g} never adds an anchor: at data.max_length = {max_length} it gives at "
            f"most {most}, not more than the floor anchors.num_per_sequence = {anchors.num_per_sequence}"
        ]
    return []
