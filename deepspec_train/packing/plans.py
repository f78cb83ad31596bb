"""Packing orders: how a chunk's block groups are assigned to token-budgeted micro-batches.

Both orders cut every sequence into the same block groups (``packer.split_anchors``) and hold the same limits
(summed group cost within ``token_budget``, at most ``max_sequences`` packed sequences); they differ only in which
micro-batch a group joins:

- ``in_order`` (``packer.plan_micro_batches``): greedy in input order; a group that does not fit closes the
  current micro-batch, whose unused budget is lost. The historical plan, and the default (every existing run's
  numbers are this plan's).
- ``first_fit``: groups by decreasing cost (ties in input order), each into the first micro-batch it fits, a new
  one when none has room; inside a micro-batch the groups keep their input order. Should that plan ever need more
  micro-batches than ``in_order`` (first fit decreasing is not optimal, and greedy in a lucky order can beat it),
  the ``in_order`` plan is returned, so ``first_fit`` never uses more micro-batches.

The micro-batch a group lands in does not change the step's gradient: the loss is normalised by the step's
supervised slots, not per micro-batch, and a block's attention sees only its own sequence's context (tested).
Orders are looked up by the recipe's ``anchors.packing`` name in ``PACKING_ORDERS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from deepspec_train.config.schema import PackingOrderName
from deepspec_train.packing.packer import BlockGroup, plan_micro_batches, split_anchors

# (anchors per sequence, block size, token budget, max packed sequences) -> groups per micro-batch.
Planner = Callable[[Sequence[torch.Tensor], int, int, Optional[int]], list[list[BlockGroup]]]


def first_fit_decreasing(
    anchors: Sequence[torch.Tensor], block_size: int, token_budget: int, max_sequences: Optional[int] = None
) -> list[list[BlockGroup]]:
    """First fit by decreasing group cost (deterministic: ties keep input order), without the fallback."""
    groups = [
        group
        for item, item_anchors in enumerate(anchors)
        if item_anchors.numel() > 0
        for group in split_anchors(item, item_anchors.sort().values, block_size, token_budget)
    ]
    costs = [group.cost(block_size) for group in groups]
    members: list[list[int]] = []
    used: list[int] = []
    for index in sorted(range(len(groups)), key=lambda i: (-costs[i], i)):
        for bin_index, bin_used in enumerate(used):
            room = max_sequences is None or len(members[bin_index]) < max_sequences
            if room and bin_used + costs[index] <= token_budget:
                members[bin_index].append(index)
                used[bin_index] += costs[index]
                break
        else:
            members.append([index])
            used.append(costs[index])
    return [[groups[i] for i in sorted(bin_members)] for bin_members in members]


def plan_first_fit(
    anchors: Sequence[torch.Tensor], block_size: int, token_budget: int, max_sequences: Optional[int] = None
) -> list[list[BlockGroup]]:
    """``first_fit_decreasing``, or the ``in_order`` plan where that one needs fewer micro-batches."""
    packed = first_fit_decreasing(anchors, block_size, token_budget, max_sequences)
    greedy = plan_micro_batches(anchors, block_size, token_budget, max_sequences)
    return packed if len(packed) <= len(greedy) else greedy


@dataclass(frozen=True)
class PackingOrder:
    """One way of assigning block groups to micro-batches (see the module docstring)."""

    name: PackingOrderName
    plan: Planner


IN_ORDER = PackingOrder("in_order", plan_micro_batches)
FIRST_FIT = PackingOrder("first_fit", plan_first_fit)
PACKING_ORDERS: dict[str, PackingOrder] = {order.name: order for order in (IN_ORDER, FIRST_FIT)}


def packing_order(name: str) -> PackingOrder:
    """The packing order a recipe's ``anchors.packing`` names."""
    if name not in PACKING_ORDERS:
        raise ValueError(f"unknown packing order {name!r}; known: {', '.join(PACKING_ORDERS)}")
    return PACKING_ORDERS[name]
