"""Draft one block from a trained drafter at decode time: tokens, draft distributions and confidence logits.

The speculative decoder hands a drafter the target context it has so far (decoder-layer features at positions
``0..a-1`` and the tokens there) and the anchor token ``x_a``; the drafter proposes ``K`` tokens for positions
``a+1..a+K`` together with the distribution ``q_k`` (over the target vocabulary) each was sampled from, which
exact verification needs. Every call drafts ``R`` rows that share the context but may have different anchors:
the decoder uses ``R = 1``; the losslessness test drafts thousands of rows at once.

- DSpark / DFlash (``ParallelBlockDrafter``): the backbone runs once over ``[x_a, MASK, ...]`` (once per distinct
  anchor); then slots are sampled left to right, slot ``k``'s logits being the backbone logits plus the Markov
  bias ``W2 u_k`` computed from the token sampled for the slot before (``prev_0 = x_a``): ``u_k = W1[prev]``
  for the vanilla head, gated by the slot state for the gated head, the recurrent state's output for the RNN
  head (which carries its state from slot to slot). The confidence logit of slot ``k`` reads ``W1[prev]`` with
  the same ``prev`` as its logits. DFlash has neither head. A drafter trained with z-lab labels
  (slot ``j >= 1`` predicts ``x_{a+j}``) drafts from slots ``1..B-1``. Over a reduced draft vocabulary each
  slot samples a draft id, mapped to its target id through ``d2t`` (the Markov step reads target ids), and ``q``
  is zero outside the draft vocabulary.
- EAGLE-3 (``Eagle3BlockDrafter``): autoregressive; step ``k`` consumes the token sampled at step ``k-1``. Its
  draft vocabulary is mapped back to target ids through ``d2t``, and ``q`` is zero outside the draft vocabulary.

What a round costs is what a serving engine would spend, for both kinds:

- EAGLE-3 steps through a KV cache (``Eagle3Drafter.start_draft``): ``K`` drafts cost ``K`` one-position passes of
  its layer, not the ``O(K^2)`` of re-running earlier steps;
- context keys / values are kept across the rounds of a conversation when the context carries a ``cache`` (the
  decoder's sessions do): each round projects only the rows its context gained (the accepted tokens), through
  every layer of a parallel drafter, through the one layer of EAGLE-3;
- a parallel drafter's block pass is one pass of its ``N`` layers over the block (``decode_states``: the
  training mask for one sequence at one anchor, so no mask is needed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import torch

from deepspec_train.config.schema import DSPARK_LABELS, LABEL_CONVENTIONS, ZLAB_LABELS
from deepspec_train.models.sampling import probs_from_logits
from deepspec_train.models.eagle3_drafter import Eagle3Drafter
from deepspec_train.models.parallel_drafter import ParallelDrafter

EAGLE_ROWS_PER_CALL = 128


@dataclass
class DraftContext:
    """Target context of one sequence: ``features [a, F]`` (tapped layers at positions ``0..a-1``) and
    ``tokens [a]`` (the tokens at those positions). The anchor sits at position ``a``.

    ``cache``, when given, is a dict owned by one conversation whose context only grows (the decoder's
    ``TargetSession``): drafters keep the projected context keys / values of earlier rounds there and project
    only the rows added since."""

    features: torch.Tensor
    tokens: torch.Tensor
    cache: Optional[dict] = None

    @property
    def anchor_position(self) -> int:
        return int(self.tokens.shape[0])


ProjectRows = Callable[[int, int], list[tuple[torch.Tensor, torch.Tensor]]]


def context_kv(
    context: DraftContext, owner: object, total: int, project: ProjectRows, cacheable: bool = True
) -> list[tuple[torch.Tensor, ...]]:
    """Keys / values ``[1, G, total, h]`` (one pair per layer) of the first ``total`` context items, from
    ``project(start, end)`` -- only for the items not in ``context.cache`` yet (all of them when not
    ``cacheable``: keys that depend on the round, as with dynamic RoPE scaling)."""
    if context.cache is None or not cacheable:
        return project(0, total)
    store = context.cache.setdefault(id(owner), {"rows": 0, "kv": None, "tokens": context.tokens[:0]})
    done = store["rows"]
    if done > total or not torch.equal(store["tokens"], context.tokens[: store["tokens"].numel()]):
        raise ValueError("the context cache belongs to another conversation: its context does not extend this one")
    if done < total or store["kv"] is None:
        new = project(done, total)
        old = store["kv"]
        store["kv"] = new if old is None else [
            (torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2)) for (k0, v0), (k1, v1) in zip(old, new)
        ]
        store["rows"], store["tokens"] = total, context.tokens.clone()
    return store["kv"]


@dataclass
class DraftBlock:
    """``tokens [R, K]`` (target ids), ``probs [R, K, V]`` (target vocabulary, fp32) and, for a drafter with a
    confidence head, ``confidence_logits [R, K]``."""

    tokens: torch.Tensor
    probs: torch.Tensor
    confidence_logits: Optional[torch.Tensor]


class BlockDrafter(Protocol):
    """Anything the speculative decoder can ask for a block (the real drafters, or a scripted one in tests)."""

    max_block_size: int

    def draft(
        self,
        context: DraftContext,
        anchor_tokens: torch.Tensor,
        num_tokens: int,
        temperature: float,
        generator: Optional[torch.Generator] = None,
    ) -> DraftBlock: ...


def sample_tokens(probs: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One token per row of ``probs [R, V]``; the argmax when greedy (``probs`` is then one-hot).

    Inverse-CDF sampling in fp64 (one uniform per row against the cumulative sum): exact, and much faster than
    ``torch.multinomial`` on CPU when thousands of rows are drafted at once. A zero-probability token is never
    drawn, because ``searchsorted(right=True)`` skips the flat steps of the CDF.
    """
    if temperature <= 0:
        return probs.argmax(dim=-1)
    cdf = torch.cumsum(probs.double(), dim=-1)
    uniforms = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)
    index = torch.searchsorted(cdf, uniforms * cdf[:, -1:], right=True)
    return index.squeeze(1).clamp(max=probs.shape[-1] - 1)


def check_num_tokens(num_tokens: int, max_block_size: int) -> None:
    """Refuse a request for ``num_tokens`` drafts from a drafter that drafts ``1..max_block_size`` per block."""
    if not 1 <= num_tokens <= max_block_size:
        raise ValueError(f"this drafter drafts 1..{max_block_size} tokens per block, asked {num_tokens}")


class BackboneBlockDrafter(ABC):
    """What every drafter with a parallel backbone (``ParallelDrafter`` and its subclasses) drafts from: the label
    convention's first drafted slot and one backbone pass over ``[x_a, MASK, ...]`` per anchor."""

    def __init__(self, module: ParallelDrafter, labels: str = DSPARK_LABELS) -> None:
        if labels not in LABEL_CONVENTIONS:
            raise ValueError(f"unknown label convention {labels!r}")
        self.module = module
        # z-lab labels: slot 0 holds the anchor and predicts nothing, so drafts come from slots 1..B-1.
        self.slot_offset = 1 if labels == ZLAB_LABELS else 0
        self.max_block_size = module.block_size - self.slot_offset

    def _block_states(self, context: DraftContext, anchors: torch.Tensor) -> torch.Tensor:
        """The backbone's states ``[n, B, d]`` of the blocks ``[anchor, MASK, ...]`` of ``anchors [n]`` after
        ``context`` (its keys / values kept across rounds in ``context.cache`` where they can be)."""
        module = self.module
        positions = torch.arange(context.anchor_position, device=context.features.device)
        # Dynamic RoPE scaling rotates every key for this round's length (a + B): nothing is kept across rounds.
        dynamic = module.rotary.dynamic
        seq_len = context.anchor_position + module.block_size if dynamic else 0
        kv = context_kv(context, module, context.anchor_position,
                        lambda s, e: module.context_kv(context.features[s:e], positions[s:e], seq_len),
                        cacheable=not dynamic)
        block_input = torch.full((anchors.numel(), module.block_size), module.mask_token_id, dtype=torch.long,
                                 device=anchors.device)
        block_input[:, 0] = anchors
        return module.decode_states(block_input, context.anchor_position, kv)

    @torch.no_grad()
    def draft(
        self,
        context: DraftContext,
        anchor_tokens: torch.Tensor,
        num_tokens: int,
        temperature: float,
        generator: Optional[torch.Generator] = None,
    ) -> DraftBlock:
        check_num_tokens(num_tokens, self.max_block_size)
        return self._draft(context, anchor_tokens, num_tokens, temperature, generator)

    @abstractmethod
    def _draft(self, context: DraftContext, anchor_tokens: torch.Tensor, num_tokens: int, temperature: float,
               generator: Optional[torch.Generator]) -> DraftBlock:
        """``draft`` once the request is checked: the kind's sampling after ``_block_states``."""


class ParallelBlockDrafter(BackboneBlockDrafter):
    """DSpark / DFlash drafting: one backbone pass, then sequential Markov sampling (see the module docstring)."""

    def _draft(self, context: DraftContext, anchor_tokens: torch.Tensor, num_tokens: int, temperature: float,
               generator: Optional[torch.Generator]) -> DraftBlock:
        module = self.module
        # Rows with the same anchor share the backbone pass: only the Markov sampling differs between them.
        many = anchor_tokens.numel() > 1
        anchors, row_anchor = torch.unique(anchor_tokens, return_inverse=True) if many else (anchor_tokens, None)
        hidden = self._block_states(context, anchors)
        if many:
            hidden = hidden[row_anchor]
        hidden = hidden[:, self.slot_offset : self.slot_offset + num_tokens]
        # The backbone logits of every slot in one product; only the Markov bias waits for the sampled tokens.
        base_logits = module.lm_head(hidden)
        head = module.markov_head
        state = projection = None
        if head is not None:
            state, projection = head.initial_state(hidden[:, 0]), head.hidden_projection(hidden)
        prev = anchor_tokens.clone()
        vocab = module.draft_vocab
        tokens, probs = [], []
        for k in range(num_tokens):
            logits = base_logits[:, k]
            if head is not None:
                latent, state = head.step(prev, None if projection is None else projection[:, k], state)
                # The bias accumulated into the slot's logits in one product.
                logits = torch.addmm(logits, latent, head.markov_w2.weight.T)
            q = probs_from_logits(logits, temperature)
            prev = sample_tokens(q, temperature, generator)
            if vocab is not None:
                # Over a reduced vocabulary the draft lives on draft ids: the sample (which the next Markov step
                # reads) and its distribution move to target ids, where verification happens.
                prev = vocab.draft_to_target(prev)
                q = q.new_zeros(q.shape[0], vocab.target_vocab_size).index_copy_(1, vocab.target_ids(), q)
            tokens.append(prev)
            probs.append(q)
        drafted = torch.stack(tokens, dim=1)
        conf = None
        if module.confidence_head is not None:
            # Slot k's confidence reads W1 of the token before it (the anchor, then the drafts), as in SGLang.
            prev_tokens = torch.cat([anchor_tokens[:, None], drafted[:, :-1]], dim=1)
            conf = module.confidence_logits(hidden, module.markov_rows(prev_tokens)).float()
        return DraftBlock(tokens=drafted, probs=torch.stack(probs, dim=1), confidence_logits=conf)


class Eagle3BlockDrafter:
    """EAGLE-3 drafting: autoregressive steps over the drafter's own samples, mapped to target ids."""

    def __init__(self, module: Eagle3Drafter) -> None:
        self.module = module
        self.max_block_size = module.ttt_steps

    @torch.no_grad()
    def draft(
        self,
        context: DraftContext,
        anchor_tokens: torch.Tensor,
        num_tokens: int,
        temperature: float,
        generator: Optional[torch.Generator] = None,
    ) -> DraftBlock:
        check_num_tokens(num_tokens, self.max_block_size)
        if context.anchor_position < 1:
            raise ValueError("EAGLE-3 needs the target feature at position a-1: the anchor cannot be position 0")
        # Each row is its own block in the module's dense step mask, which grows as rows^2: draft in groups.
        parts = [
            self._draft_rows(context, rows, num_tokens, temperature, generator)
            for rows in anchor_tokens.split(EAGLE_ROWS_PER_CALL)
        ]
        tokens = torch.cat([p.tokens for p in parts])
        return DraftBlock(tokens=tokens, probs=torch.cat([p.probs for p in parts]), confidence_logits=None)

    def _draft_rows(
        self,
        context: DraftContext,
        anchor_tokens: torch.Tensor,
        num_tokens: int,
        temperature: float,
        generator: Optional[torch.Generator],
    ) -> DraftBlock:
        module = self.module
        vocab = module.t2d.shape[0]
        target_ids = module.draft_vocab.target_ids()
        # Context entries t = 1..a-1 pair token x_t with feature g_{t-1}; entry i is t = i + 1.
        a = context.anchor_position
        positions = torch.arange(1, a, device=context.features.device)
        # Dynamic RoPE scaling rotates every key for this round's length (a + K): nothing is kept across rounds.
        dynamic = module.rotary.dynamic
        seq_len = a + num_tokens if dynamic else 0
        (kv,) = context_kv(context, module, a - 1, lambda s, e: [module.entry_kv(
            context.tokens[s + 1 : e + 1], context.features[s:e], positions[s:e], seq_len)], cacheable=not dynamic)
        steps = module.start_draft(kv, context.features[a - 1], len(anchor_tokens), a, seq_len)
        token = anchor_tokens
        tokens, probs = [], []
        for _ in range(num_tokens):
            # Each step consumes the token sampled at the step before (the anchor first), on top of the KV cache.
            hidden = steps.step(token)
            q_draft = probs_from_logits(module.lm_head(module.norm(hidden)), temperature)
            token = module.draft_vocab.draft_to_target(sample_tokens(q_draft, temperature, generator))
            q = q_draft.new_zeros(q_draft.shape[0], vocab)
            q[:, target_ids] = q_draft
            tokens.append(token)
            probs.append(q)
        return DraftBlock(tokens=torch.stack(tokens, dim=1), probs=torch.stack(probs, dim=1), confidence_logits=None)


def calibrated_confidences(logits: torch.Tensor, temperatures: Optional[list[float]]) -> torch.Tensor:
    """``sigmoid(z_k / T_k)`` for ``logits [..., K]``; ``T = 1`` when no temperatures were calibrated."""
    if temperatures is None:
        return torch.sigmoid(logits)
    num = logits.shape[-1]
    if len(temperatures) < num:
        raise ValueError(f"{len(temperatures)} calibrated temperatures for {num} drafted positions")
    temps = torch.tensor(temperatures[:num], dtype=logits.dtype, device=logits.device)
    return torch.sigmoid(logits / temps)
