"""Pick each decoding row's next token from the recipe's sampling law, using a uniform number the row owns.

The law is the one ``transformers``' ``generate`` and vLLM sample from: logits divided by the temperature, cut to
the ``top_k`` most likely tokens, then to the most likely tokens whose mass reaches ``top_p`` (a token stays when
the mass of the tokens ranked above it is below ``top_p``), renormalised. ``temperature == 0`` is greedy: the first
most likely token, as ``torch.argmax`` (and so ``generate``) picks it.

A token is drawn by inverting the law's cumulative distribution at a uniform number in [0, 1) that the caller
supplies, one per row. Each row owns its random stream, so what it says does not depend on which rows decode next
to it, in which order, or whether the run was resumed. Cutting to ``top_k`` candidates first keeps the top-p sort
to ``top_k`` values per row instead of the whole vocabulary.
"""

from __future__ import annotations

import torch

from deepspec_train.regenerate.sampling import SamplingParams


def candidate_law(logits: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The law of each row of ``logits`` ``[rows, vocab]`` (``sampling`` not greedy) as candidate token ids and
    their probabilities, both ``[rows, candidates]``; candidates outside the law have probability 0."""
    scores = logits.float() / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        scores, ids = scores.topk(sampling.top_k, dim=-1)
    elif sampling.top_p < 1:
        scores, ids = scores.sort(dim=-1, descending=True)
    else:
        ids = torch.arange(vocab, device=scores.device).expand_as(scores)
    probs = scores.softmax(dim=-1)
    if sampling.top_p < 1:
        # Candidates are sorted here (topk and sort both return them most likely first).
        mass_above = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_above >= sampling.top_p, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return ids, probs


def next_tokens(logits: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits`` ``[rows, vocab]``: the law's inverse CDF at ``uniforms`` ``[rows]`` (float64
    in [0, 1), ignored when greedy)."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    ids, probs = candidate_law(logits, sampling)
    # Float64 so that the cut points of a candidate with a tiny probability are not lost to rounding.
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    picks = torch.searchsorted(cdf, uniforms.to(cdf.device).unsqueeze(-1) * total, right=True)
    # u * total can round up to total itself; the last candidate with mass is then the one u points at.
    last_with_mass = (cdf < total).sum(dim=-1, keepdim=True)
    return ids.gather(-1, torch.minimum(picks, last_with_mass)).squeeze(-1)
