"""Exact chain speculative sampling: how one verification round turns a drafted block into emitted tokens.

A drafter proposes ``K`` tokens ``x_1..x_K``, token ``x_k`` sampled from the draft distribution ``q_k`` (which
may depend on the earlier drafted tokens). The target scores the drafted prefix in one pass and yields
``p_1..p_{K+1}``: ``p_k`` is its next-token distribution after ``x_1..x_{k-1}``, and ``p_{K+1}`` (row ``K`` in
0-based indexing) is the distribution after the whole block. The round is then:

1. for ``k = 1..K``: accept ``x_k`` with probability ``min(1, p_k(x_k) / q_k(x_k))``; stop at the first rejection;
2. on a rejection at ``k``, emit one token from the residual ``(p_k - q_k)_+`` renormalised;
3. if all ``K`` drafts are accepted, emit a bonus token from ``p_{K+1}``.

So a round emits ``accepted + 1`` tokens, and their law is exactly the target's own (Leviathan et al. 2023,
Chen et al. 2023). ``temperature == 0`` means greedy decoding: accept while the draft equals the target's
argmax, then emit the target's argmax.

Every function works on a batch of rows so the evaluator can verify all requests of a step at once. Rows may
verify different numbers of drafted tokens (``lengths``, as chosen by the scheduler): a row that verifies
``j < K`` tokens behaves as a block of size ``j``, its row ``j`` of ``target_probs`` being the bonus
distribution. The two pure pieces, ``acceptance_probs`` and ``correction_distribution``, are exposed so tests
can enumerate every accept/reject branch exactly.

Degenerate residual. In exact arithmetic the probability of rejecting at ``k`` is
``sum_x (q_k(x) - p_k(x))_+ = sum_x (p_k(x) - q_k(x))_+`` (both distributions sum to one), i.e. the residual's
own mass. So when the residual mass is ~0, ``p_k == q_k`` and a rejection has probability ~0. Floating-point
rounding can still leave a residual that is pure noise (about one machine epsilon of the input dtype); below
``_RESIDUAL_TOL_EPS`` epsilons we sample from ``p_k`` instead. That branch is reached with probability at most
the tolerance itself, so it moves the output law by at most that much, and it never emits noise-driven tokens.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

# Residual masses below this many machine epsilons (of the probabilities' dtype) are treated as rounding noise.
_RESIDUAL_TOL_EPS = 16.0


class VerifyResult(NamedTuple):
    """Outcome of verifying a batch of drafted blocks.

    ``accepted [R]``: drafted tokens accepted per row. ``tokens [R, K+1]``: the emitted tokens, ``accepted + 1``
    per row (the accepted drafts, then the correction or bonus token), padded with ``-1``.
    """

    accepted: torch.Tensor
    tokens: torch.Tensor


def _verified_lengths(
    num_rows: int, block: int, device: torch.device, lengths: Optional[torch.Tensor]
) -> torch.Tensor:
    """``lengths`` as a validated ``[R]`` long tensor; every row verifies the whole block when it is ``None``."""
    if lengths is None:
        return torch.full((num_rows,), block, dtype=torch.long, device=device)
    lengths = torch.as_tensor(lengths, dtype=torch.long, device=device)
    if lengths.shape != (num_rows,) or bool((lengths < 0).any()) or bool((lengths > block).any()):
        raise ValueError(f"lengths must be [{num_rows}] with values in 0..{block}, got {lengths.tolist()}")
    return lengths


def _check_shapes(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor) -> None:
    num_rows, block = draft_tokens.shape
    vocab = target_probs.shape[-1]
    if draft_probs.shape != (num_rows, block, vocab) or target_probs.shape != (num_rows, block + 1, vocab):
        raise ValueError(
            f"expected draft_probs [{num_rows}, {block}, V] and target_probs [{num_rows}, {block + 1}, V]; got "
            f"{tuple(draft_probs.shape)} and {tuple(target_probs.shape)}"
        )


def acceptance_probs(
    draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> torch.Tensor:
    """``min(1, p_k(x_k) / q_k(x_k))`` for ``draft_tokens [R, K]``, ``draft_probs [R, K, V]``,
    ``target_probs [R, K+1, V]``; returns ``[R, K]`` in fp64.

    A token the draft gave zero probability cannot have been sampled from it; such a token is never accepted
    (losslessness assumes ``x_k ~ q_k``, so this only decides what happens to malformed input).
    """
    _check_shapes(draft_tokens, draft_probs, target_probs)
    index = draft_tokens.unsqueeze(-1)
    q = draft_probs.gather(-1, index).squeeze(-1).double()
    p = target_probs[:, :-1].gather(-1, index).squeeze(-1).double()
    ratio = torch.where(q > 0, p / q.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(q))
    return ratio.clamp(max=1.0)


def correction_distribution(
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    accepted: torch.Tensor,
    lengths: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Distribution of the token emitted after ``accepted [R]`` accepted drafts; returns ``[R, V]`` in fp64.

    If ``accepted < length`` the draft at that position was rejected: the residual ``(p - q)_+`` renormalised
    (``p`` if the residual is rounding noise, see the module docstring). If ``accepted == length`` the whole
    verified block was accepted: the bonus distribution ``p`` at row ``length``.
    """
    num_rows, block, _ = draft_probs.shape
    lengths = _verified_lengths(num_rows, block, draft_probs.device, lengths)
    accepted = torch.as_tensor(accepted, dtype=torch.long, device=draft_probs.device)
    rows = torch.arange(num_rows, device=draft_probs.device)
    p = target_probs[rows, accepted].double()
    q = draft_probs[rows, accepted.clamp(max=block - 1)].double() if block > 0 else torch.zeros_like(p)
    # Past the verified length there is no draft to reject, so the residual against "no draft" is p itself.
    q = q * (accepted < lengths).unsqueeze(-1)
    residual = (p - q).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    tolerance = _RESIDUAL_TOL_EPS * max(torch.finfo(target_probs.dtype).eps, torch.finfo(draft_probs.dtype).eps)
    return torch.where(mass > tolerance, residual / mass.clamp_min(tolerance), p / p.sum(dim=-1, keepdim=True))


def _emit(draft_tokens: torch.Tensor, accepted: torch.Tensor, last_token: torch.Tensor) -> VerifyResult:
    num_rows, block = draft_tokens.shape
    slots = torch.arange(block + 1, device=draft_tokens.device)
    padded = torch.cat([draft_tokens, draft_tokens.new_full((num_rows, 1), -1)], dim=1)
    tokens = torch.where(slots < accepted.unsqueeze(1), padded, torch.full_like(padded, -1))
    tokens[torch.arange(num_rows, device=draft_tokens.device), accepted] = last_token
    return VerifyResult(accepted=accepted, tokens=tokens)


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """Number of leading ``True`` per row of a ``[R, K]`` bool mask."""
    return torch.cumprod(mask.long(), dim=1).sum(dim=1)


def verify_blocks(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    lengths: Optional[torch.Tensor] = None,
) -> VerifyResult:
    """One exact speculative-sampling round for every row.

    ``draft_tokens [R, K]`` were sampled from ``draft_probs [R, K, V]``; ``target_probs [R, K+1, V]`` are the
    target's distributions after each drafted prefix (row ``K``, or row ``lengths[r]``, is the bonus
    distribution). ``lengths [R]`` (default ``K``) is how many drafted tokens each row verifies.
    """
    lengths = _verified_lengths(*draft_tokens.shape, draft_tokens.device, lengths)
    ratio = acceptance_probs(draft_tokens, draft_probs, target_probs)
    uniforms = torch.rand(ratio.shape, generator=generator, dtype=torch.float64, device=ratio.device)
    in_block = torch.arange(draft_tokens.shape[1], device=draft_tokens.device) < lengths.unsqueeze(1)
    accepted = _leading_true((uniforms < ratio) & in_block)
    correction = correction_distribution(draft_probs, target_probs, accepted, lengths)
    last_token = torch.multinomial(correction, 1, generator=generator).squeeze(1)
    return _emit(draft_tokens, accepted, last_token)


def verify_blocks_greedy(
    draft_tokens: torch.Tensor, target_scores: torch.Tensor, lengths: Optional[torch.Tensor] = None
) -> VerifyResult:
    """Greedy verification (temperature 0): accept while ``x_k == argmax p_k``, then emit ``argmax`` of the next
    row. ``target_scores [R, K+1, V]`` may be logits or probabilities (only the argmax matters; ties go to the
    lowest token id, as ``torch.argmax`` does)."""
    lengths = _verified_lengths(*draft_tokens.shape, draft_tokens.device, lengths)
    target_argmax = target_scores.argmax(dim=-1)
    in_block = torch.arange(draft_tokens.shape[1], device=draft_tokens.device) < lengths.unsqueeze(1)
    accepted = _leading_true((draft_tokens == target_argmax[:, :-1]) & in_block)
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    return _emit(draft_tokens, accepted, target_argmax[rows, accepted])


def verify_block(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
) -> tuple[int, list[int]]:
    """Single-block form of ``verify_blocks``: ``draft_tokens [K]``, ``draft_probs [K, V]``,
    ``target_probs [K+1, V]``; returns ``(accepted, emitted tokens)`` with ``accepted + 1`` emitted tokens."""
    result = verify_blocks(draft_tokens[None], draft_probs[None], target_probs[None], generator)
    accepted = int(result.accepted[0])
    return accepted, result.tokens[0, : accepted + 1].tolist()


def verify_block_greedy(draft_tokens: torch.Tensor, target_scores: torch.Tensor) -> tuple[int, list[int]]:
    """Single-block form of ``verify_blocks_greedy``: ``draft_tokens [K]``, ``target_scores [K+1, V]``."""
    result = verify_blocks_greedy(draft_tokens[None], target_scores[None])
    accepted = int(result.accepted[0])
    return accepted, result.tokens[0, : accepted + 1].tolist()
