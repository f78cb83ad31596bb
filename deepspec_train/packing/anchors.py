"""Anchor sampling and block labels.

An anchor ``a`` is valid where ``loss_mask[a]`` and ``loss_mask[a+1]`` hold (the anchor token and at least
one token to predict sit in the supervised span). Each sequence trains on ``anchor_count`` of its valid positions,
drawn without replacement: ``num_anchors`` (all of them when it has fewer) or, with a rate ``per_1k_tokens``,
the larger of that and ``round(per_1k_tokens * valid / 1024)``, never more than ``valid`` (``anchor_counts``).

For each anchor the block's labels follow one of two conventions:

- ``"dspark"``: slot ``k`` predicts ``x[a+k+1]``; its target distribution comes from the target state at
  ``a+k``. Supervised iff ``loss_mask[a+1 .. a+k+1]`` all hold and ``a+k+1 < L``.
- ``"zlab"`` (DFlash's own, for the z-lab export only): slot 0 is unsupervised; slot ``j >= 1`` predicts
  ``x[a+j]`` from the target state at ``a+j-1``. Supervised iff ``loss_mask[a+1 .. a+j]`` all hold and
  ``a+j < L``.

Either way the supervised slots are a contiguous run: labels past the end of the assistant span are dropped.
"""

from __future__ import annotations

from typing import Optional

import torch

from deepspec_train.config.schema import DSPARK_LABELS, LABEL_CONVENTIONS, ZLAB_LABELS, LabelConvention
from deepspec_train.packing.anchor_counts import anchor_count
from deepspec_train.packing.batch import IGNORE_INDEX


def valid_anchor_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions ``a`` with ``loss_mask[a] & loss_mask[a+1]``, ascending (LongTensor)."""
    mask = loss_mask.bool()
    return torch.nonzero(mask[:-1] & mask[1:], as_tuple=False).flatten()


def sample_anchors(
    loss_mask: torch.Tensor,
    num_anchors: int,
    generator: Optional[torch.Generator] = None,
    per_1k_tokens: Optional[float] = None,
) -> torch.Tensor:
    """``anchor_count`` valid anchors drawn without replacement, sorted ascending.

    Sequences with no more valid positions than that contribute all of them.
    """
    valid = valid_anchor_positions(loss_mask)
    count = anchor_count(valid.numel(), num_anchors, per_1k_tokens)
    if valid.numel() <= count:
        return valid
    pick = torch.randperm(valid.numel(), generator=generator)[:count]
    return valid[pick].sort().values


def block_labels(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    convention: LabelConvention = DSPARK_LABELS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and target positions of the blocks at ``anchors``.

    Returns ``labels [n, B]`` (token id, or ``IGNORE_INDEX`` where unsupervised) and ``target_positions
    [n, B]`` (position whose target final-norm state gives the slot's target distribution, ``-1`` where
    unsupervised).
    """
    if convention not in LABEL_CONVENTIONS:
        raise ValueError(f"unknown label convention {convention!r}")
    length = int(input_ids.shape[0])
    mask = loss_mask.bool()
    slots = torch.arange(block_size, device=anchors.device)
    # Position of the predicted token for each slot: a+k+1 (dspark) or a+k (zlab).
    shift = 1 if convention == DSPARK_LABELS else 0
    predicted = anchors[:, None] + slots[None, :] + shift
    in_range = predicted < length
    predicted_mask = mask[predicted.clamp(max=length - 1)] & in_range
    if convention == ZLAB_LABELS:
        # Slot 0 would predict the anchor itself: unsupervised, and it must not break the run that follows.
        predicted_mask[:, 0] = True
    # Contiguous prefix: a slot is supervised only if every earlier predicted token was supervised too.
    supervised = predicted_mask.long().cumprod(dim=1).bool()
    if convention == ZLAB_LABELS:
        supervised[:, 0] = False
    tokens = input_ids[predicted.clamp(max=length - 1)]
    labels = torch.where(supervised, tokens, torch.full_like(predicted, IGNORE_INDEX))
    target_positions = torch.where(supervised, predicted - 1, torch.full_like(predicted, -1))
    return labels, target_positions
