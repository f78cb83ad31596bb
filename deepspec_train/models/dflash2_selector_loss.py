"""DFlash2's selector term: a weighted K-way cross-entropy over each supervised slot's top-K candidates.

Per supervised row ``i`` (one block slot with state ``h_i``, true token ``y_i`` and true previous token ``x_i``):
the candidates ``c_1..c_K`` are the top-K tokens of the frozen head's logits ``W h_i`` (chosen without gradient),
the unary scores their logits ``<W[c_k], h_i>`` (with gradient into ``h_i``), and the selector's teacher-forced
scores ``s_ik = unary_ik + <A[x_i] * W_h h_i, B[c_k]>`` (``CandidateSelector.scores`` with the true predecessor).
With temperature ``T`` (``loss.temperature``, the same as the distribution terms):

``loss = weight * sum_i w_i * [y_i in c_i] * -log softmax(s_i / T)[k(y_i)] / n_i``

where ``w_i`` are the kind's position weights, ``n_i`` the step's normaliser (``losses.selected_logit_loss``'s),
and a row whose true token is not among its candidates has no term (the walk could not propose it anyway). Plain
autograd: the ``[rows, K]`` scores are small; the candidate rows of the head (``[rows, K, d]``) are kept for the
backward, chosen in chunks of ``chunk_size`` rows so the ``[rows, V]`` logits never exist in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from deepspec_train.models.dflash2_drafter import CandidateSelector


@dataclass(frozen=True)
class SelectorRows:
    """One loss call's rows: ``hidden [N, d]``, ``head_weight [V, d]`` (frozen), ``predecessors [N]``,
    ``labels [N]`` (target ids), ``weights [N]``."""

    hidden: torch.Tensor
    head_weight: torch.Tensor
    predecessors: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor


@dataclass
class SelectorLossOutput:
    """The weighted term (``weight`` applied, normalised) and detached diagnostics: the weighted CE sum over the
    covered rows and how many rows had their true token among the candidates."""

    loss: torch.Tensor
    ce_sum: torch.Tensor
    covered: torch.Tensor


@torch.no_grad()
def top_k_candidates(hidden: torch.Tensor, head_weight: torch.Tensor, top_k: int, chunk_size: int) -> torch.Tensor:
    """The ``[N, K]`` ids of the largest logits of each row, ``chunk_size`` rows of logits at a time."""
    parts = [torch.topk(chunk @ head_weight.T.to(chunk.dtype), top_k, dim=-1).indices
             for chunk in hidden.split(chunk_size)]
    return torch.cat(parts) if parts else hidden.new_zeros(0, top_k, dtype=torch.long)


def selector_loss(rows: SelectorRows, selector: CandidateSelector, top_k: int, weight: float,
                  temperature: float = 1.0, normalizer: Optional[float | torch.Tensor] = None,
                  chunk_size: int = 1024) -> SelectorLossOutput:
    """The selector term of ``rows``; see the module docstring. ``normalizer``: a positive number, a positive
    ``[N]`` tensor (one denominator per row) or None (the row count)."""
    hidden = rows.hidden
    ids = top_k_candidates(hidden.detach(), rows.head_weight, top_k, chunk_size)
    unary = torch.einsum("nd,nkd->nk", hidden.float(), rows.head_weight[ids].float())
    scores = selector.scores(hidden, rows.predecessors[:, None], ids, unary)[:, 0] / temperature
    hits = ids == rows.labels[:, None]
    covered = hits.any(dim=-1)
    ce = -F.log_softmax(scores, dim=-1).gather(1, hits.long().argmax(dim=-1, keepdim=True))[:, 0]
    weighted = torch.where(covered, rows.weights.to(ce.dtype) * ce, torch.zeros_like(ce))
    if normalizer is None:
        normalizer = float(max(hidden.shape[0], 1))
    denominator = normalizer.to(ce) if isinstance(normalizer, torch.Tensor) else float(normalizer)
    loss = weight * (weighted / denominator).sum()
    return SelectorLossOutput(loss=loss, ce_sum=weighted.detach().sum(), covered=covered.sum())


@torch.no_grad()
def selector_acceptance(rows: SelectorRows, target_hidden: torch.Tensor, target_head_weight: torch.Tensor,
                        selector: CandidateSelector, top_k: int, temperature: float,
                        chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the analytic acceptance ``c* = sum_k min(q[c_k], p_t[c_k])`` of the selector's teacher-forced
    proposal ``q = softmax(s / T)`` over the top-K candidates (zero elsewhere, so only candidates count) against
    the target's ``p_t = softmax(target_hidden @ W_t^T / T)``, and whether ``q``'s argmax is the label: ``[N]``
    fp32 and ``[N]`` bool. ``q`` is the proposal the walk drafts from and verification divides by
    (``models.dflash2_drafting``), given an accepted (true) predecessor. ``chunk_size`` rows of ``[rows, V]``
    logits at a time."""
    c_star, correct = [], []
    for start in range(0, rows.hidden.shape[0], chunk_size):
        span = slice(start, start + chunk_size)
        hidden = rows.hidden[span]
        logits = (hidden @ rows.head_weight.T.to(hidden.dtype)).float()
        unary, ids = torch.topk(logits, top_k, dim=-1)
        scores = selector.scores(hidden, rows.predecessors[span, None], ids, unary)[:, 0]
        q = torch.softmax(scores / temperature, dim=-1)
        target = (target_hidden[span] @ target_head_weight.T.to(target_hidden.dtype)).float()
        p_target = torch.softmax(target / temperature, dim=-1).gather(1, ids)
        c_star.append(torch.minimum(q, p_target).sum(dim=-1))
        correct.append(ids.gather(1, q.argmax(dim=-1, keepdim=True))[:, 0] == rows.labels[span])
    if not c_star:
        return rows.hidden.new_zeros(0, dtype=torch.float32), rows.labels.new_zeros(0, dtype=torch.bool)
    return torch.cat(c_star), torch.cat(correct)
