"""Tiny DFlash2 drafters for the unit tests: the recipe settings, a drafter with every weight random (the
convolutions and the selector's successor rows too, so neither is the identity / zero it starts at), and a
reference of the convolution written as the formula's loops."""

from __future__ import annotations

import torch

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.models.dflash2_drafter import DFlash2Drafter, GroupedDynamicConv
from deepspec_train.models.geometry import DrafterGeometry
from tests.helpers.tiny_geometry import BLOCK, MASK_ID, TINY_GEOMETRY

LAYER_IDS = [0, 2]
SETTINGS = dict(conv_kernel_size=3, conv_group_size=8, selector_rank=6, selector_top_k=4, selector_loss_weight=0.7)


def dflash2_config(**overrides: object) -> DrafterConfig:
    """A tiny DFlash2 config: 2 layers, z-lab labels, 3 taps over groups of 8 channels, rank 6, top 4."""
    base = dict(kind="dflash2", num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID, markov_rank=0,
                confidence_head=False, labels="zlab", **SETTINGS)
    base.update(overrides)
    return DrafterConfig(**base)


def randomize(module: DFlash2Drafter, seed: int = 0) -> DFlash2Drafter:
    """Every DFlash2 weight random (in place), the norms around 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif "conv" in name or "candidate_selector" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return module


def tiny_dflash2(seed: int = 0, geometry: DrafterGeometry = TINY_GEOMETRY, **overrides: object) -> DFlash2Drafter:
    """A tiny fp32 DFlash2 with every weight random, in eval mode."""
    torch.manual_seed(seed)
    return randomize(DFlash2Drafter(geometry, dflash2_config(**overrides), LAYER_IDS), seed).eval()


def brute_force_conv(conv: GroupedDynamicConv, x: torch.Tensor, delta_from: torch.Tensor, side: int) -> torch.Tensor:
    """The convolution by its formula, one output element at a time: rows ``[T, d]`` in blocks of
    ``conv.block_size``, the delta of side ``side`` projected from ``delta_from [T, d]``."""
    rows, width = x.shape
    delta = (delta_from @ conv.kernel_projection.weight.T).view(rows, 2, conv.taps, conv.num_groups)
    out = torch.zeros_like(x)
    for p in range(rows):
        slot = p % conv.block_size
        for c in range(width):
            for t in range(conv.taps):
                if t <= slot:
                    coefficient = conv.base_kernel[side, t, c] + delta[p, side, t, c // conv.group_size]
                    out[p, c] += coefficient * x[p - t, c]
    return out
