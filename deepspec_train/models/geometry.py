"""Drafter geometry: the handful of target sizes a drafter is built from.

A drafter shares the target's hidden size, heads, vocabulary and rotary settings (it consumes target
features and reuses the target's embedding and LM head); only the MLP width may differ (a recipe field).
``geometry_from_target_config`` reads these from a transformers ``Qwen3Config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class DrafterGeometry:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    num_target_layers: int
    max_position_embeddings: int


def _rope_theta(hf_config: Any) -> float:
    # transformers 5.x moved rope settings into `rope_parameters`; 4.x kept a top-level `rope_theta`.
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(hf_config, "rope_theta", None)
    if theta is None:
        raise ValueError("target config has neither rope_parameters['rope_theta'] nor rope_theta")
    return float(theta)


def geometry_from_target_config(hf_config: Any, intermediate_size: Optional[int] = None) -> DrafterGeometry:
    """Geometry of a drafter for the target described by ``hf_config`` (a ``Qwen3Config``)."""
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return DrafterGeometry(
        hidden_size=int(hf_config.hidden_size),
        intermediate_size=int(intermediate_size if intermediate_size is not None else hf_config.intermediate_size),
        num_attention_heads=int(hf_config.num_attention_heads),
        num_key_value_heads=int(hf_config.num_key_value_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=_rope_theta(hf_config),
        vocab_size=int(hf_config.vocab_size),
        num_target_layers=int(hf_config.num_hidden_layers),
        max_position_embeddings=int(hf_config.max_position_embeddings),
    )
