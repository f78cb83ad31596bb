"""Packing anchor blocks from several sequences into token-budgeted micro-batches.

Cost rule. A group of blocks of one sequence whose largest anchor is ``m`` costs ``m + n_blocks * B`` tokens:
the context rows ``0 .. m-1`` it needs (every block sees only positions before its own anchor) plus ``B``
slots per block. Micro-batches are filled greedily, in input order, while the summed cost stays within
``token_budget`` (and, when given, the number of packed sequences within ``max_sequences``).

Splitting. A sequence whose whole anchor set costs more than the budget is cut into groups of consecutive
(sorted) anchors, each as large as the budget allows; each group carries only the context rows it needs and
becomes its own packed sequence (its own entry in ``sample_ids``). A single block that cannot fit
(``anchor + B > token_budget``) is an error: raise the budget to at least ``max_length + B``.

Target features are gathered lazily: ``ctx_features`` and ``final_hidden`` of a ``SequenceItem`` may be full
tensors or callables taking a LongTensor of positions, so a streamed source fetches only what
``needed_positions`` lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch

from deepspec_train.config.schema import DSPARK_LABELS, LabelConvention
from deepspec_train.packing.anchors import block_labels
from deepspec_train.packing.batch import IGNORE_INDEX, PackedBatch

# Rows of a per-position feature: the full ``[L, F]`` tensor, or a callable giving the rows at given positions.
PositionRows = Union[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]


@dataclass
class SequenceItem:
    """One tokenised sequence with its target features (``[L, K*d]`` / ``[L, d]`` or position callables)."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    ctx_features: PositionRows
    final_hidden: PositionRows
    sample_id: int


@dataclass(frozen=True)
class BlockGroup:
    """Consecutive anchors of one sequence packed together (``item`` indexes the input items)."""

    item: int
    anchors: torch.Tensor

    def cost(self, block_size: int) -> int:
        return int(self.anchors.max()) + block_size * int(self.anchors.numel())


def _rows(source: PositionRows, positions: torch.Tensor) -> torch.Tensor:
    return source(positions) if callable(source) else source[positions]


def needed_positions(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    convention: LabelConvention = DSPARK_LABELS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions a target worker must send for these anchors.

    Returns ``(ctx_positions, hidden_positions)``: context-feature positions ``0 .. max_anchor-1`` and the
    sorted unique positions whose final-norm state is a supervised slot's target.
    """
    if anchors.numel() == 0:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty
    _, target_positions = block_labels(input_ids, loss_mask, anchors, block_size, convention)
    ctx_positions = torch.arange(int(anchors.max()), dtype=torch.long)
    return ctx_positions, torch.unique(target_positions[target_positions >= 0])


def supervised_per_slot(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    convention: LabelConvention = DSPARK_LABELS,
) -> torch.Tensor:
    """Supervised rows of the blocks at ``anchors`` per block slot, ``int64 [block_size]``: what
    ``build_packed_batch`` will label, known from the tokens and the loss mask alone (a target worker announces a
    step's counts before it runs the target)."""
    if anchors.numel() == 0:
        return torch.zeros(block_size, dtype=torch.long)
    labels, _ = block_labels(input_ids, loss_mask, anchors, block_size, convention)
    return (labels != IGNORE_INDEX).sum(0).long()


def split_anchors(item: int, anchors: torch.Tensor, block_size: int, token_budget: int) -> list[BlockGroup]:
    """Cut one sequence's sorted anchors into groups that each fit ``token_budget`` (greedy, in order)."""
    groups: list[BlockGroup] = []
    start = 0
    for end in range(1, anchors.numel() + 1):
        # Anchors are sorted, so the group's largest anchor is its last one.
        if int(anchors[end - 1]) + block_size > token_budget:
            raise ValueError(
                f"block at anchor {int(anchors[end - 1])} needs {int(anchors[end - 1]) + block_size} tokens, "
                f"more than token_budget={token_budget}"
            )
        if int(anchors[end - 1]) + block_size * (end - start) > token_budget:
            groups.append(BlockGroup(item, anchors[start : end - 1]))
            start = end - 1
    if start < anchors.numel():
        groups.append(BlockGroup(item, anchors[start:]))
    return groups


def plan_micro_batches(
    anchors: Sequence[torch.Tensor],
    block_size: int,
    token_budget: int,
    max_sequences: Optional[int] = None,
) -> list[list[BlockGroup]]:
    """Assign every (sorted) anchor of every sequence to a micro-batch; see the module docstring for the rule."""
    plan: list[list[BlockGroup]] = []
    current: list[BlockGroup] = []
    used = 0
    for item, item_anchors in enumerate(anchors):
        if item_anchors.numel() == 0:
            continue
        for group in split_anchors(item, item_anchors.sort().values, block_size, token_budget):
            cost = group.cost(block_size)
            full = used + cost > token_budget or (max_sequences is not None and len(current) >= max_sequences)
            if current and full:
                plan.append(current)
                current, used = [], 0
            current.append(group)
            used += cost
    if current:
        plan.append(current)
    return plan


def build_packed_batch(
    items: Sequence[SequenceItem],
    groups: Sequence[BlockGroup],
    block_size: int,
    mask_token_id: int,
    convention: LabelConvention = DSPARK_LABELS,
) -> PackedBatch:
    """One ``PackedBatch`` holding ``groups`` (packed-sequence index = position in ``groups``)."""
    ctx_features, ctx_tokens, ctx_seq, ctx_pos = [], [], [], []
    block_input, block_seq, block_anchor, block_prev, labels, target_hidden = [], [], [], [], [], []
    slots = torch.arange(block_size)
    for seq_index, group in enumerate(groups):
        item = items[group.item]
        ids = item.input_ids.long()
        length = int(ids.shape[0])
        anchors = group.anchors.long()
        num_ctx = int(anchors.max())
        positions = torch.arange(num_ctx, dtype=torch.long)
        ctx_features.append(_rows(item.ctx_features, positions))
        ctx_tokens.append(ids[:num_ctx])
        ctx_seq.append(torch.full((num_ctx,), seq_index, dtype=torch.long))
        ctx_pos.append(positions)

        group_input = torch.full((anchors.numel(), block_size), mask_token_id, dtype=torch.long)
        group_input[:, 0] = ids[anchors]
        block_input.append(group_input)
        block_seq.append(torch.full((anchors.numel(),), seq_index, dtype=torch.long))
        block_anchor.append(anchors)
        # Teacher-forced previous token x[a+k]; slots past the sequence end get the mask token (never supervised).
        prev_pos = anchors[:, None] + slots[None, :]
        block_prev.append(torch.where(prev_pos < length, ids[prev_pos.clamp(max=length - 1)], mask_token_id))
        group_labels, target_positions = block_labels(ids, item.loss_mask, anchors, block_size, convention)
        labels.append(group_labels)
        target_hidden.append(_rows(item.final_hidden, target_positions[target_positions >= 0]))

    return PackedBatch(
        ctx_features=torch.cat(ctx_features),
        ctx_tokens=torch.cat(ctx_tokens),
        ctx_seq=torch.cat(ctx_seq),
        ctx_pos=torch.cat(ctx_pos),
        block_input=torch.cat(block_input),
        block_seq=torch.cat(block_seq),
        block_anchor=torch.cat(block_anchor),
        block_prev=torch.cat(block_prev),
        labels=torch.cat(labels),
        target_hidden=torch.cat(target_hidden),
        sample_ids=torch.tensor([items[g.item].sample_id for g in groups], dtype=torch.long),
    )


def pack_sequences(
    items: Sequence[SequenceItem],
    anchors: Sequence[torch.Tensor],
    block_size: int,
    token_budget: int,
    mask_token_id: int,
    convention: LabelConvention = DSPARK_LABELS,
    max_sequences: Optional[int] = None,
) -> list[PackedBatch]:
    """Pack the blocks at ``anchors[i]`` of every ``items[i]`` into token-budgeted micro-batches."""
    if len(items) != len(anchors):
        raise ValueError(f"{len(items)} items but {len(anchors)} anchor sets")
    plan = plan_micro_batches(anchors, block_size, token_budget, max_sequences)
    return [build_packed_batch(items, groups, block_size, mask_token_id, convention) for groups in plan]
