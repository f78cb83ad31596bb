"""Qwen3-style building blocks shared by every drafter (RMSNorm, rotary embeddings, SwiGLU, GQA attention).

Parameter names follow the serving layouts' shared decoder layer (``serving_layouts.layout_checks``:
``input_layernorm``, ``self_attn.q_proj`` ..., ``mlp.gate_proj`` ...) so that a drafter's ``state_dict`` is already the
export layout.

Tensor layout for attention: ``[batch, heads, tokens, head_dim]`` (the layout of SDPA and flex_attention).
``apply_rotary`` takes ``x [..., heads, T, head_dim]`` and ``cos``/``sin`` ``[..., T, head_dim]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from deepspec_train.models.rope_parameters import check_rope_parameters
from deepspec_train.models.rope_scaling import rope_frequencies

AttentionBackend = Literal["sdpa", "flex"]


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in fp32 like Qwen3's."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        # fp32 statistics: bf16 variance of a 4096-wide state loses too many bits.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (half-split "rotate_half" convention of Qwen3/Llama), with the target's scaling.

    ``rope_parameters`` is the target's (``models.rope_scaling``: default, linear, dynamic, yarn, llama3; None means
    plain RoPE with base ``theta``); frequencies and yarn's cos / sin factor follow transformers' arithmetic.
    The inverse frequencies are recomputed on every call instead of being a buffer: they are never exported
    (``rotary_emb.inv_freq`` is not in any checkpoint), a model built on the meta device stays correct after it is
    materialised, and dynamic scaling depends on the positions of the call.
    """

    def __init__(
        self,
        head_dim: int,
        theta: float,
        rope_parameters: Optional[Mapping[str, Any]] = None,
        max_position_embeddings: int = 0,
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        self.theta = float(theta)
        self.rope_parameters = dict(rope_parameters or {"rope_type": "default", "rope_theta": self.theta})
        check_rope_parameters(self.rope_parameters)
        self.max_position_embeddings = int(max_position_embeddings)
        self.dynamic = self.rope_parameters.get("rope_type") == "dynamic"

    @classmethod
    def for_geometry(cls, geometry: Any) -> "RotaryEmbedding":
        """The rotary embedding of a ``DrafterGeometry`` (the target's RoPE)."""
        return cls(geometry.head_dim, geometry.rope_theta, geometry.rope_parameters, geometry.max_position_embeddings)

    def cos_sin(self, positions: torch.Tensor, seq_len: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [...]`` (int) -> ``(cos, sin)``, each ``[..., head_dim]`` in fp32.

        ``seq_len`` is the length dynamic scaling is computed for (transformers: the largest position of the
        forward + 1); it defaults to that of ``positions``. Pass one length for every call of a forward so that
        queries and keys rotate with the same frequencies."""
        if seq_len is None:
            # Only dynamic scaling reads the largest position (a device sync); the other types never do.
            seq_len = int(positions.max()) + 1 if self.dynamic and positions.numel() else 0
        inv_freq, scale = rope_frequencies(self.rope_parameters, self.head_dim, self.max_position_embeddings, seq_len)
        # fp32 throughout, the same arithmetic as the Qwen3 reference, so drafter and serving engine agree.
        angles = positions.float()[..., None] * inv_freq.to(positions.device)
        angles = torch.cat([angles, angles], dim=-1)
        if scale == 1.0:
            return angles.cos(), angles.sin()
        return angles.cos() * scale, angles.sin() * scale


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., heads, T, head_dim]`` by ``cos``/``sin`` ``[..., T, head_dim]`` (broadcast over heads)."""
    cos = cos.unsqueeze(-3)
    sin = sin.unsqueeze(-3)
    rotated = x.float() * cos + _rotate_half(x.float()) * sin
    return rotated.to(x.dtype)


class SwiGLU(nn.Module):
    """Gated MLP ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


_compiled_flex = None


def _flex(compiled: bool):
    """Eager flex_attention on CPU (tests); a compiled one, built once, for GPU training."""
    global _compiled_flex
    if not compiled:
        return flex_attention
    if _compiled_flex is None:
        # Default (automatic) dynamic shapes: packed lengths change every micro-batch, so a static compile
        # would recompile each step.
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Union[torch.Tensor, BlockMask, None],
    backend: AttentionBackend = "sdpa",
    compiled: bool = False,
) -> torch.Tensor:
    """Scaled dot-product attention with grouped-query heads.

    ``q [b, H, Q, h]``, ``k``/``v`` ``[b, G, KV, h]`` with ``H % G == 0``. ``mask`` is a boolean ``[Q, KV]``
    (True = may attend) for ``"sdpa"``, a ``BlockMask`` for ``"flex"``. Returns ``[b, H, Q, h]``.
    Every query row must allow at least one key (a drafter query always sees its own block).
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} not a multiple of kv heads {k.shape[1]}")
    if backend == "sdpa":
        if isinstance(mask, BlockMask):
            raise TypeError("the sdpa backend needs a dense boolean mask")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    if backend == "flex":
        if mask is not None and not isinstance(mask, BlockMask):
            raise TypeError("the flex backend needs a BlockMask")
        return _flex(compiled)(q, k, v, block_mask=mask, enable_gqa=True)
    raise ValueError(f"unknown attention backend {backend!r}")
