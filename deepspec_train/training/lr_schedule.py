"""Linear warmup then cosine decay to zero, as a ``LambdaLR`` multiplier."""

from __future__ import annotations

import math

import torch


def warmup_cosine_factor(step: int, total_steps: int, warmup_steps: int) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_frac: float) -> torch.optim.lr_scheduler.LambdaLR:
    warmup_steps = int(round(warmup_frac * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine_factor(step, total_steps, warmup_steps)
    )
