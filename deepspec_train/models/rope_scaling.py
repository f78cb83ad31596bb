"""RoPE frequencies from a target's ``rope_parameters``, computed the way transformers computes them for that
target, so that the drafter rotates queries and keys exactly as the target (and the serving engines, which apply
the export's copied ``rope_parameters``) do.

Supported ``rope_type``: ``default``, ``linear``, ``dynamic`` (NTK-aware, recomputed from the largest position
seen, as transformers does on a fresh model), ``yarn`` (with its cos / sin attention factor) and ``llama3``; the
settings are read and checked by ``models.rope_parameters`` (without torch, so recipe validation can refuse a
type before anything loads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from deepspec_train.models.rope_parameters import check_rope_parameters

def _default_inv_freq(base: float | torch.Tensor, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))


def _dynamic_inv_freq(params: Mapping[str, Any], dim: int, max_positions: int, seq_len: int) -> torch.Tensor:
    # transformers grows the base from the longest position seen (as an int64 tensor, so in fp32 arithmetic).
    length = torch.maximum(torch.tensor(seq_len), torch.tensor(max_positions))
    factor = params["factor"]
    base = params["rope_theta"] * ((factor * length / max_positions) - (factor - 1)) ** (dim / (dim - 2))
    return _default_inv_freq(base, dim)


def _yarn(params: Mapping[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    base = params["rope_theta"]
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_positions / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        if params.get("mscale") and params.get("mscale_all_dim"):
            attention = float(mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"]))
        else:
            attention = mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention)


def _llama3(params: Mapping[str, Any], dim: int) -> torch.Tensor:
    inv_freq = _default_inv_freq(params["rope_theta"], dim)
    factor, low_f, high_f = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low_f, old_len / high_f
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_frequencies(
    params: Mapping[str, Any], head_dim: int, max_position_embeddings: int, seq_len: int = 0
) -> tuple[torch.Tensor, float]:
    """``(inv_freq [head_dim / 2] fp32, attention factor for cos / sin)``; ``seq_len`` (largest position + 1 in the
    current call) only matters for ``dynamic``, which rescales once it exceeds ``max_position_embeddings``."""
    check_rope_parameters(params)
    rope_type = params.get("rope_type", "default")
    if rope_type == "yarn":
        return _yarn(params, head_dim, max_position_embeddings)
    if rope_type == "llama3":
        return _llama3(params, head_dim), 1.0
    if rope_type == "dynamic" and seq_len > max_position_embeddings:
        return _dynamic_inv_freq(params, head_dim, max_position_embeddings, seq_len), 1.0
    inv_freq = _default_inv_freq(params["rope_theta"], head_dim)
    if rope_type == "linear":
        inv_freq = inv_freq / params["factor"]
    return inv_freq, 1.0
