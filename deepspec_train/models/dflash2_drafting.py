"""Draft one block from a DFlash2 drafter at decode time: the backbone pass, then the selector's walk.

The backbone runs once over ``[x_a, MASK, ...]`` as for DFlash (``ParallelBlockDrafter``); each drafted slot ``e``
then has its top-K candidates and the ``K x K`` pairwise scores ``score[e, p, c]`` of candidate ``c`` after
predecessor ``p`` (``CandidateSelector.scores``; slot 0's predecessors are all the anchor, so all its rows are
equal). The walk goes left to right: slot 0 reads row 0, slot ``e`` reads the row of the candidate chosen at
``e - 1``. At temperature ``T > 0`` the proposal is ``q_e = softmax(row / T)`` over the K candidates (zero on every
other token) and the candidate is drawn from it by inverse CDF (``sample_tokens``: one uniform per row, as SGLang's
walk); at ``T = 0`` it is the row's argmax and ``q_e`` its point mass. Verification receives exactly the ``q_e``
the token was drawn from, so exact speculative sampling stays lossless (``tests/test_dflash2_drafting.py``).
A drafter trained with z-lab labels (the engines' 1 + N layout) drafts from slots ``1..B-1``.
"""

from __future__ import annotations

from typing import Optional

import torch

from deepspec_train.config.schema import ZLAB_LABELS
from deepspec_train.models.block_drafting import BackboneBlockDrafter, DraftBlock, DraftContext, sample_tokens
from deepspec_train.models.dflash2_drafter import DFlash2Drafter
from deepspec_train.models.sampling import probs_from_logits


def selector_lattice(module: DFlash2Drafter, hidden: torch.Tensor,
                     anchor_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate ids ``[R, n, K]`` and pairwise scores ``[R, n, K, K]`` (slot, predecessor index, candidate index)
    of the drafted slots' states ``hidden [R, n, d]`` after the anchors ``[R]``."""
    ids, unary = module.candidates(hidden)
    top_k = ids.shape[-1]
    first = anchor_tokens.reshape(-1, 1, 1).expand(-1, 1, top_k)
    predecessors = torch.cat([first, ids[:, :-1]], dim=1)
    return ids, module.candidate_selector.scores(hidden, predecessors, ids, unary)


def walk_lattice(ids: torch.Tensor, scores: torch.Tensor, vocab_size: int, temperature: float,
                 generator: Optional[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """The selector's walk over a lattice (see the module docstring): tokens ``[R, n]`` and their proposals
    ``q [R, n, vocab_size]`` (fp32, zero outside each slot's candidates)."""
    rows, slots, _ = ids.shape
    batch = torch.arange(rows, device=ids.device)
    index = torch.zeros(rows, dtype=torch.long, device=ids.device)
    tokens, probs = [], []
    for e in range(slots):
        q_k = probs_from_logits(scores[batch, e, index], temperature)
        index = sample_tokens(q_k, temperature, generator)
        tokens.append(ids[batch, e, index])
        probs.append(q_k.new_zeros(rows, vocab_size).scatter_(1, ids[:, e], q_k))
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)


class DFlash2BlockDrafter(BackboneBlockDrafter):
    """DFlash2 drafting: one backbone pass, then the selector's walk (see the module docstring)."""

    def __init__(self, module: DFlash2Drafter, labels: str = ZLAB_LABELS) -> None:
        super().__init__(module, labels)

    def _draft(self, context: DraftContext, anchor_tokens: torch.Tensor, num_tokens: int, temperature: float,
               generator: Optional[torch.Generator]) -> DraftBlock:
        module = self.module
        # Rows with the same anchor share the backbone pass and the lattice: only the walk differs between them.
        anchors, row_anchor = torch.unique(anchor_tokens, return_inverse=True)
        hidden = self._block_states(context, anchors)[:, self.slot_offset : self.slot_offset + num_tokens]
        ids, scores = selector_lattice(module, hidden, anchors)
        tokens, probs = walk_lattice(ids[row_anchor], scores[row_anchor], module.lm_head.weight.shape[0],
                                     temperature, generator)
        return DraftBlock(tokens=tokens, probs=probs, confidence_logits=None)
