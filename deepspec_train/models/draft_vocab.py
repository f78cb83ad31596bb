"""EAGLE-3's reduced draft vocabulary and its maps to and from the target vocabulary.

An EAGLE-3 drafter predicts over the ``N`` target tokens most often supervised in the training data instead of
the full target vocabulary (151,936 for Qwen3), which shrinks its LM head. Serving engines translate a draft id
back with ``target_id = draft_id + d2t[draft_id]`` and test membership with the boolean ``t2d[target_id]``; an
export without these maps silently collapses acceptance, so they are built once here and travel with the model.

Usage: ``counts = count_supervised_tokens(examples, vocab_size)`` over the tokenized training set, then
``vocab = build_draft_vocab(counts, recipe.drafter.draft_vocab_size)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class DraftVocab:
    """``d2t [N]`` int64 offsets (draft id -> target id) and ``t2d [V]`` bool membership of target ids."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.d2t.shape[0])

    @property
    def target_vocab_size(self) -> int:
        return int(self.t2d.shape[0])

    @property
    def is_full(self) -> bool:
        """True when the draft vocabulary is the whole target vocabulary with identity maps."""
        return self.size == self.target_vocab_size and bool((self.d2t == 0).all())

    def target_ids(self) -> torch.Tensor:
        """Target id of every draft id, ``[N]``, increasing."""
        return torch.arange(self.size, dtype=torch.long, device=self.d2t.device) + self.d2t

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Map draft ids (any shape) to target ids."""
        return ids + self.d2t[ids]

    def target_to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        """Map target ids (any shape) to draft ids; ``-1`` where the target token is not in the draft vocab."""
        # Draft ids are assigned in increasing target-id order, so a running count of members is the draft id.
        rank = torch.cumsum(self.t2d.long(), dim=0) - 1
        return torch.where(self.t2d[ids], rank[ids], torch.full_like(ids, -1))


def build_draft_vocab(token_counts: torch.Tensor, size: int | None) -> DraftVocab:
    """Keep the ``size`` most frequent target tokens (ties broken by lower id); ``None`` or ``>= V``: all of them.

    The kept tokens are sorted by target id before numbering, which is the order serving engines expect (``d2t``
    is then non-decreasing, and ``target_to_draft`` is a rank).
    """
    vocab_size = int(token_counts.shape[0])
    if size is None or size >= vocab_size:
        return DraftVocab(
            d2t=torch.zeros(vocab_size, dtype=torch.long),
            t2d=torch.ones(vocab_size, dtype=torch.bool),
        )
    if size <= 0:
        raise ValueError(f"draft vocabulary size must be positive, got {size}")
    # A stable sort on descending counts keeps equal counts in increasing id order.
    order = torch.sort(token_counts.to(torch.long), descending=True, stable=True).indices
    kept = torch.sort(order[:size]).values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[kept] = True
    return DraftVocab(d2t=kept - torch.arange(size, dtype=torch.long), t2d=t2d)


def count_supervised_tokens(dataset_iter: Iterable[Mapping[str, Any]], vocab_size: int) -> torch.Tensor:
    """Count, per target id, the tokens that carry loss: ``input_ids[p]`` where ``loss_mask[p]`` holds.

    Each example is a mapping with ``input_ids`` and ``loss_mask`` (tensors or lists of equal length), the
    layout of the tokenized shards. Returns int64 counts ``[vocab_size]``.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for example in dataset_iter:
        ids = torch.as_tensor(example["input_ids"], dtype=torch.long).reshape(-1)
        mask = torch.as_tensor(example["loss_mask"]).reshape(-1).bool()
        if ids.shape != mask.shape:
            raise ValueError(f"input_ids {tuple(ids.shape)} and loss_mask {tuple(mask.shape)} differ in length")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise ValueError(f"token ids outside [0, {vocab_size})")
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def stored_draft_vocab(state: Mapping[str, torch.Tensor]) -> DraftVocab | None:
    """The draft vocabulary a checkpoint ``state`` stores (its ``d2t`` / ``t2d`` maps); None when it stores none."""
    if "d2t" in state and "t2d" in state:
        return DraftVocab(d2t=state["d2t"], t2d=state["t2d"])
    return None
