"""Per-slot loss weights for block drafters.

DSpark and DFlash weight the loss of block slot ``k`` (1-based, ``k = 1..block_size``) by
``exp(-(k - 1) / gamma_decay)``: early slots matter most because a draft is only accepted up to its first
rejection. Code indexes slots from 0, so slot index ``s`` gets ``exp(-s / gamma_decay)`` and slot 0 gets 1.
EAGLE-3 uses its own per-step weights and passes them to the loss directly.
"""

from __future__ import annotations

import torch


def decay_weights(slot_index: torch.Tensor | int, gamma_decay: float) -> torch.Tensor:
    """Return ``exp(-slot_index / gamma_decay)`` as float32, for 0-based slot indices of any shape."""
    if gamma_decay <= 0:
        raise ValueError(f"gamma_decay must be positive, got {gamma_decay}")
    slots = torch.as_tensor(slot_index)
    if slots.is_floating_point() or slots.is_complex():
        raise TypeError("slot_index must hold integer slot indices")
    if bool((slots < 0).any()):
        raise ValueError("slot indices are 0-based and must be non-negative")
    return torch.exp(-slots.to(torch.float32) / gamma_decay)
