"""Drafter geometry: the handful of target sizes a drafter is built from.

A drafter shares the target's hidden size, heads, vocabulary and rotary settings, RoPE scaling included (it
consumes target features, reuses the target's embedding and LM head, and is served with the target's
``rope_parameters``); only the MLP width may differ (a recipe field). ``geometry_from_target_config`` reads these
from a transformers ``Qwen3Config``; ``check_target_rope(hf_config)`` refuses an unsupported RoPE type early.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from deepspec_train.common.errors import UserError
from deepspec_train.models.rope_parameters import check_rope_parameters, normalized_rope_parameters


# What a drafter reads from any target's config (``head_dim`` defaults to hidden_size / heads).
GEOMETRY_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                   "vocab_size", "num_hidden_layers", "max_position_embeddings")


class UnsupportedTargetConfig(UserError, ValueError):
    """A target config without a field the drafter's geometry needs (one-line message)."""


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
    # The target's RoPE settings (``models.rope_scaling``). Absent from drafter_config.json files written before it
    # existed: those drafters were built with plain RoPE of base ``rope_theta``, which is what None stands for.
    rope_parameters: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        params = self.rope_parameters or {"rope_type": "default", "rope_theta": float(self.rope_theta)}
        check_rope_parameters(params)
        object.__setattr__(self, "rope_parameters", dict(params))


def geometry_from_target_config(hf_config: Any, intermediate_size: Optional[int] = None) -> DrafterGeometry:
    """Geometry of a drafter for the target described by ``hf_config`` (a ``Qwen3Config`` or a config.json dict
    wrapped in a namespace); refuses a RoPE type the drafter does not implement."""
    missing = [key for key in GEOMETRY_FIELDS if getattr(hf_config, key, None) is None
               and not (key == "intermediate_size" and intermediate_size is not None)]
    if missing:
        raise UnsupportedTargetConfig(
            f"target config ({type(hf_config).__name__}) has no {', '.join(missing)}, which a drafter copies from "
            "its target (set drafter.intermediate_size for a missing MLP width)")
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    rope = normalized_rope_parameters(hf_config)
    return DrafterGeometry(
        hidden_size=int(hf_config.hidden_size),
        intermediate_size=int(intermediate_size if intermediate_size is not None else hf_config.intermediate_size),
        num_attention_heads=int(hf_config.num_attention_heads),
        num_key_value_heads=int(hf_config.num_key_value_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=rope["rope_theta"],
        vocab_size=int(hf_config.vocab_size),
        num_target_layers=int(hf_config.num_hidden_layers),
        max_position_embeddings=int(hf_config.max_position_embeddings),
        rope_parameters=rope,
    )


def check_target_rope(hf_config: Any) -> None:
    """One-line ``ValueError`` when the target's RoPE is a kind the drafter cannot reproduce (call it as soon as
    the target's config is read, before any training starts)."""
    check_rope_parameters(normalized_rope_parameters(hf_config))
