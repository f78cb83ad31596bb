"""Per-sequence loss normalisation: one denominator per supervised row, so that every sequence weighs the same.

Per-token normalisation divides every row of a step by one number, the step's supervised slots, so a long
answer with many anchors counts more than a short one. Per-sequence normalisation (``loss.normalizer=sequence``)
divides row ``i`` of sequence ``s`` by ``S * W_s``, where ``W_s`` is the summed position weight of every
supervised row of ``s`` in the step and ``S`` the number of sequences the step draws. The step loss is then the
mean over sequences of each sequence's position-weighted mean:

    loss = (1 / S) * sum_s [ sum_{i in s} w_i * term_i / W_s ].

This is DeepSpec's rule (``deepspec/modeling/dspark/loss.py``: each term's numerator over the summed position
weights, all-reduced over ranks, per micro-step of one sequence per rank, micro-steps averaged by gradient
accumulation) taken at one sequence per micro-step; DeepSpec itself, on ``W`` ranks, shares one denominator among
the ``W`` sequences of a micro-step. Here a sequence's rows may sit in several packed micro-batches (a long
sequence is split by the packer) and, in principle, on several drafter ranks, so ``W_s`` is summed over the whole
step and every rank before any row is normalised: the loss, and therefore the gradient, does not depend on how
the step was packed, accumulated or spread over ranks. A sequence without a supervised row adds nothing to the
sum but still counts in ``S`` (as in DeepSpec, where its micro-step contributes zero).

Sequences are identified by their dataset index (``PackedBatch.sample_ids``), unique within a step. ``W_s``
comes from the step's per-sequence counts of supervised rows per block slot (``StepBatches.slot_counts``), known
from the packing plan before any micro-batch arrives, and the kind's position weight of each slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from deepspec_train.packing.batch import PackedBatch


def row_sequence_ids(batch: PackedBatch) -> torch.Tensor:
    """Dataset index of the sequence of every supervised row, ``[Ns]`` in row-major order of the labels."""
    per_slot = batch.sample_ids[batch.block_seq].unsqueeze(1).expand_as(batch.labels)
    return per_slot[batch.supervised_mask]


def sequence_weight_sums(slot_counts: Mapping[int, torch.Tensor], slot_weights: torch.Tensor) -> dict[int, float]:
    """``{sequence id: summed row weight}`` from each sequence's supervised rows per block slot (``[B]`` counts)
    and the position weight of each slot (``[B]``): ``W_s = sum_k counts_s[k] * w_k``."""
    weights = slot_weights.detach().cpu().double()
    sums = {}
    for key, counts in slot_counts.items():
        if counts.shape != weights.shape:
            raise ValueError(f"sequence {key}: {tuple(counts.shape)} slot counts for {tuple(weights.shape)} slot weights")
        sums[key] = float((counts.cpu().double() * weights).sum())
    return sums


def merge_weight_sums(parts: Iterable[dict[int, float]]) -> dict[int, float]:
    """Add per-rank ``{sequence id: weight sum}`` maps (a sequence present on several ranks sums its parts)."""
    merged: dict[int, float] = {}
    for part in parts:
        for key, total in part.items():
            merged[key] = merged.get(key, 0.0) + total
    return merged


def row_normalizers(
    sequence_ids: torch.Tensor, weight_sums: dict[int, float], num_sequences: int, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``S * W_s`` for every row of sequence ``s``: the per-row denominators of ``selected_logit_loss``."""
    if num_sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, got {num_sequences}")
    ids = sequence_ids.tolist()
    missing = sorted({i for i in ids if weight_sums.get(i, 0.0) <= 0.0})
    if missing:
        raise ValueError(f"rows of sequences {missing[:5]} have no positive weight sum to be normalised by")
    values = [num_sequences * weight_sums[i] for i in ids]
    return torch.tensor(values, dtype=dtype, device=sequence_ids.device)
