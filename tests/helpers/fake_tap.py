"""A stand-in for a tapped target in step-plan and packing tests: features that depend only on the token and its
position, so every built micro-batch can be checked against the tokens it came from."""

from __future__ import annotations

from types import SimpleNamespace

import torch


class FakeTap:
    """``ctx_features [b, L, 6]`` and ``final_hidden [b, L, 3]`` from ``100 * token + position`` (fp32)."""

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        base = (input_ids * 100 + positions).float().unsqueeze(-1)
        return SimpleNamespace(ctx_features=base.expand(-1, -1, 6) + torch.arange(6.0),
                               final_hidden=base.expand(-1, -1, 3))
