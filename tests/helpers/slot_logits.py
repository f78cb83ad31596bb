"""Test helper: full draft logits of every slot of a packed batch, ``[Nb, B, V]`` (``[Nb, B, N]`` over a reduced
draft vocabulary), for checks against references. Training computes logits only at supervised slots, through the
chunked loss, so the drafters themselves carry no such method."""

from __future__ import annotations

import torch

from deepspec_train.models.eagle3_drafter import Eagle3Drafter
from deepspec_train.packing.batch import PackedBatch


def slot_logits(module: torch.nn.Module, batch: PackedBatch, prev_tokens: torch.Tensor | None = None,
                attention: str = "sdpa") -> torch.Tensor:
    """EAGLE-3: its LM head over the normed test-time-training states of every step. A parallel drafter (DSpark,
    DFlash): its LM head over the backbone's slot states plus, with a Markov head, the Markov bias of
    ``prev_tokens [Nb, B]`` (target ids; ``batch.block_prev`` by default)."""
    if isinstance(module, Eagle3Drafter):
        with torch.no_grad():
            return module.lm_head(module.norm(module.unroll(batch, batch.block_size, attention)))
    hidden = module.backbone(batch, attention)
    logits = module.lm_head(hidden)
    if module.markov_head is not None:
        prev = batch.block_prev if prev_tokens is None else prev_tokens
        logits = logits + module.markov_bias(module.markov_latents(prev, hidden))
    return logits
