"""The distribution a model's logits are sampled from (temperature, top-k, top-p, or greedy at temperature 0).

One definition shared by the drafters' block drafting (``models.block_drafting``) and the exact speculative
sampling that verifies their drafts (``evaluation.spec_sampling``), so both read the same distribution.
"""

from __future__ import annotations

from typing import Optional

import torch


def probs_from_logits(
    logits: torch.Tensor,
    temperature: float,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
) -> torch.Tensor:
    """Sampling distribution over the last dimension of ``logits [..., V]``.

    Applied in the order temperature, top-k, top-p (the order transformers' generation uses). ``temperature <= 0``
    returns the one-hot argmax (greedy; top-k/top-p are then irrelevant). ``top_k`` keeps the ``k`` largest
    logits (every logit tied with the ``k``-th is kept too); ``None`` or ``0`` disables it. ``top_p`` keeps the
    smallest set of most likely tokens whose mass reaches ``top_p`` (the most likely token is always kept);
    ``None`` or ``>= 1`` disables it. Computed in at least fp32.
    """
    work = logits if logits.dtype == torch.float64 else logits.float()
    if temperature <= 0:
        one_hot = torch.zeros_like(work)
        return one_hot.scatter_(-1, work.argmax(dim=-1, keepdim=True), 1.0)
    work = work / temperature
    vocab = work.shape[-1]
    if top_k is not None and 0 < top_k < vocab:
        kth_largest = torch.topk(work, top_k, dim=-1).values[..., -1:]
        work = work.masked_fill(work < kth_largest, float("-inf"))
    probs = torch.softmax(work, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # A token is kept while the mass of the more likely tokens is still short of top_p.
        keep_sorted = mass_before < top_p
        keep_sorted[..., 0] = True
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
