"""Chunk plans: a list of sequences cut into target forwards (*chunks*) and their packed micro-batches, from
token ids and loss masks alone.

A chunk is ``PackingSpec.chunk_sequences`` rows run through the target together. Its anchors are drawn from a
generator private to (seed, epoch, sequence), so they do not depend on batching or on the drafter rank, and its
packing is decided before the target runs: a plan knows every micro-batch's supervised slots and every
sequence's supervised rows per block slot, which a step announces before its first backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch

from deepspec_train.packing.anchors import LabelConvention, sample_anchors
from deepspec_train.packing.packer import BlockGroup, supervised_per_slot
from deepspec_train.packing.plans import IN_ORDER, PackingOrder


@dataclass(frozen=True)
class PackingSpec:
    """How sequences become micro-batches: anchors per sequence (``num_anchors``, the floor of a rate
    ``anchors_per_1k_tokens`` when one is set: ``packing.anchors.anchor_count``), block size, the token budget of
    one micro-batch, the mask token, the label convention, how many sequences one target forward takes, and the
    order in which a chunk's block groups fill its micro-batches."""

    block_size: int
    num_anchors: int
    token_budget: int
    mask_token_id: int
    chunk_sequences: int
    label_convention: LabelConvention = "dspark"
    anchors_per_1k_tokens: Optional[float] = None
    order: PackingOrder = IN_ORDER


@dataclass
class ChunkPlan:
    """One target forward's rows and the packed micro-batches they become (``groups``, one list of block groups
    per micro-batch, and their supervised slots), from token ids and loss masks alone."""

    rows: list[dict]
    anchors: list[torch.Tensor]
    groups: list[list[BlockGroup]]
    supervised: list[int]
    # Per sequence (dataset index) of the chunk, its supervised rows per block slot (``[block_size]`` int64).
    slot_counts: dict[int, torch.Tensor]


def anchor_generator(seed: int, epoch: int, sample_id: int) -> torch.Generator:
    """A generator private to one (seed, epoch, sample): anchors do not depend on batching or rank."""
    gen = torch.Generator()
    gen.manual_seed((seed * 1_000_003 + epoch * 7_919 + sample_id) % (2**63 - 1))
    return gen


def input_ids_of(row: dict) -> torch.Tensor:
    return torch.as_tensor(row["input_ids"], dtype=torch.long)


def loss_mask_of(row: dict) -> torch.Tensor:
    return torch.as_tensor(row["loss_mask"], dtype=torch.bool)


def plan_chunks(rows: Sequence[dict], packing: PackingSpec, seed: int, epoch: int) -> list[ChunkPlan]:
    """``rows`` (in training order) cut into chunks, each with its anchors and packing; no target forward."""
    plans = []
    for start in range(0, len(rows), packing.chunk_sequences):
        chunk_rows = list(rows[start : start + packing.chunk_sequences])
        anchors = [
            sample_anchors(loss_mask_of(row), packing.num_anchors, anchor_generator(seed, epoch, int(row["sample_id"])),
                           packing.anchors_per_1k_tokens)
            for row in chunk_rows
        ]
        groups = packing.order.plan(anchors, packing.block_size, packing.token_budget, None)
        supervised, slot_counts = [], {}
        for batch_groups in groups:
            total = 0
            for g in batch_groups:
                row = chunk_rows[g.item]
                per_slot = supervised_per_slot(input_ids_of(row), loss_mask_of(row), g.anchors, packing.block_size,
                                               packing.label_convention)
                total += int(per_slot.sum())
                sample_id = int(row["sample_id"])
                slot_counts[sample_id] = slot_counts.get(sample_id, 0) + per_slot
            supervised.append(total)
        plans.append(ChunkPlan(chunk_rows, anchors, groups, supervised, slot_counts))
    return plans


def merge_slot_counts(parts: Iterable[dict[int, torch.Tensor]]) -> dict[int, torch.Tensor]:
    """Add per-slot count maps (a sequence split over several micro-batches or chunks sums its parts)."""
    merged: dict[int, torch.Tensor] = {}
    for part in parts:
        for sample_id, counts in part.items():
            merged[sample_id] = merged[sample_id] + counts if sample_id in merged else counts.clone()
    return merged


def chunks_slot_counts(chunks: Iterable[ChunkPlan]) -> dict[int, torch.Tensor]:
    """Per sequence of a step's chunks, its supervised rows per block slot over all of them."""
    return merge_slot_counts(chunk.slot_counts for chunk in chunks)


def chunks_supervised(chunks: Iterable[ChunkPlan]) -> list[int]:
    """The supervised slots of every micro-batch of ``chunks``, in build order."""
    return [n for chunk in chunks for n in chunk.supervised]
