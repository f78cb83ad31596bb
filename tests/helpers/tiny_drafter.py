"""Tiny drafters for the parallel drafter, packing and export tests: drafters of the tiny geometry, random
sequences, and the outputs a serving engine computes from a drafter."""

from __future__ import annotations

import dataclasses

import torch

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.models.qwen3_layers import RotaryEmbedding
from deepspec_train.packing.batch import IGNORE_INDEX, PackedBatch
from deepspec_train.packing.packer import SequenceItem
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, TINY_GEOMETRY
from tests.helpers.slot_logits import slot_logits

LAYER_IDS = [0, 2]


def drafter_config(kind: str = "dspark", **overrides) -> DrafterConfig:
    """A tiny DSpark (rank 8, confidence head) or DFlash (rank 0, no confidence head) config."""
    base = dict(kind=kind, num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID)
    if kind == "dspark":
        base.update(markov_rank=8, confidence_head=True)
    else:
        base.update(markov_rank=0, confidence_head=False)
    base.update(overrides)
    return DrafterConfig(**base)


def tiny_drafter(kind: str = "dspark", seed: int = 0, **overrides) -> ParallelDrafter:
    """A tiny fp32 drafter with every weight random (Markov W2 too, so its bias is not trivially zero)."""
    torch.manual_seed(seed)
    model = ParallelDrafter(TINY_GEOMETRY, drafter_config(kind, **overrides), LAYER_IDS)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("markov_w2.weight") or name.endswith("proj.bias"):
                param.normal_(std=0.1)
    return model.eval()


def random_loss_mask(length: int, generator: torch.Generator) -> torch.Tensor:
    """Alternating unsupervised/supervised spans (like user/assistant turns), random lengths."""
    mask = torch.zeros(length, dtype=torch.bool)
    pos, supervised = 0, False
    while pos < length:
        span = int(torch.randint(2, 12, (1,), generator=generator))
        mask[pos : pos + span] = supervised
        pos += span
        supervised = not supervised
    return mask


def random_item(length: int, sample_id: int, generator: torch.Generator) -> SequenceItem:
    """A sequence with random tokens, loss mask and target features (``K*d`` context, ``d`` final)."""
    return SequenceItem(
        input_ids=torch.randint(0, MASK_ID, (length,), generator=generator),
        loss_mask=random_loss_mask(length, generator),
        ctx_features=torch.randn(length, len(LAYER_IDS) * HIDDEN, generator=generator),
        final_hidden=torch.randn(length, HIDDEN, generator=generator),
        sample_id=sample_id,
    )


def drafter_outputs(module: torch.nn.Module, batch: PackedBatch) -> dict[str, torch.Tensor]:
    """Slot logits and (DSpark) confidence logits, the quantities a serving engine computes."""
    with torch.no_grad():
        out = {"logits": slot_logits(module, batch)}
        if isinstance(module, ParallelDrafter) and module.confidence_head is not None:
            hidden = module.backbone(batch)
            out["confidence"] = module.confidence_logits(hidden, module.markov_rows(batch.block_prev))
    return out


def anchor_batch(context, anchors: torch.Tensor, width: int, fill_token: int) -> PackedBatch:
    """A packed batch of ``len(anchors)`` blocks of one sequence, all anchored at ``context.anchor_position``
    (a ``DraftContext``): what decode-time drafting computes, as a training batch for teacher-forced checks."""
    num_ctx, num_blocks = context.anchor_position, int(anchors.shape[0])
    block_input = torch.full((num_blocks, width), fill_token, dtype=torch.long)
    block_input[:, 0] = anchors
    zeros = torch.zeros(num_blocks, dtype=torch.long)
    return PackedBatch(
        ctx_features=context.features,
        ctx_tokens=context.tokens.long(),
        ctx_seq=torch.zeros(num_ctx, dtype=torch.long),
        ctx_pos=torch.arange(num_ctx),
        block_input=block_input,
        block_seq=zeros,
        block_anchor=zeros + num_ctx,
        block_prev=block_input.clone(),
        labels=torch.full_like(block_input, IGNORE_INDEX),
        target_hidden=context.features.new_zeros(0, context.features.shape[-1]),
        sample_ids=torch.zeros(1, dtype=torch.long),
    )


def use_dynamic_rope(module: torch.nn.Module, geometry: DrafterGeometry, rope: dict) -> None:
    """Give a drafter ``rope`` scaling (dynamic kinds need ``max_position_embeddings``; 8 makes short tests reach
    past the trained positions)."""
    scaled = dataclasses.replace(geometry, rope_parameters={**rope, "rope_theta": geometry.rope_theta},
                                 max_position_embeddings=8)
    module.geometry, module.rotary = scaled, RotaryEmbedding.for_geometry(scaled)
    assert module.rotary.dynamic
