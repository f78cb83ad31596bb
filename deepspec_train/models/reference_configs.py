"""Transformers configs of the production targets, built locally without the hub: the dense Qwen3-4B, 8B, 14B
and 32B (``Qwen3ForCausalLM``) and the mixture-of-experts Qwen3-30B-A3B and Qwen3-235B-A22B
(``Qwen3MoeForCausalLM``: every decoder layer routes each token to 8 of 128 experts).

Used by shape tests (drafters instantiated on the meta device), by the sizing tool, and by recipes that need the
target geometry without downloading a checkpoint. Sizes are the published ones of each model's ``config.json``.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen3Config, Qwen3MoeConfig

_COMMON = dict(
    vocab_size=151936,
    # <|endoftext|> and <|im_end|> (the tokenizer's end of turn), as in every Qwen3 config.json.
    bos_token_id=151643,
    eos_token_id=151645,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    hidden_act="silu",
    tie_word_embeddings=False,
)

_DENSE = {
    "Qwen3-4B": dict(
        hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=9728, tie_word_embeddings=True,
    ),
    "Qwen3-8B": dict(
        hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=12288,
    ),
    "Qwen3-14B": dict(
        hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
        intermediate_size=17408,
    ),
    "Qwen3-32B": dict(
        hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=25600,
    ),
}

# Qwen3-MoE: no shared expert, no dense layers (decoder_sparse_step 1, mlp_only_layers empty), top-8 of 128 with
# renormalised routing weights; intermediate_size is the (unused) dense MLP width the configs still carry.
_MOE_COMMON = dict(num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
_MOE = {
    "Qwen3-30B-A3B": dict(
        hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
        intermediate_size=6144, moe_intermediate_size=768,
    ),
    "Qwen3-235B-A22B": dict(
        hidden_size=4096, num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4,
        intermediate_size=12288, moe_intermediate_size=1536,
    ),
}


def evenly_spaced_layer_ids(num_layers: int, count: int = 5) -> list[int]:
    """``count`` context taps evenly spaced from decoder layer 1 to ``L-3`` (never the last layers), rounded as
    z-lab's and SGLang's ``build_target_layer_ids`` round them (Python's ``round``: halves go to the even side)."""
    start, end = 1, num_layers - 3
    return [int(round(start + i * (end - start) / (count - 1))) for i in range(count)]


# The DSpark / DFlash taps of each target (DeepSpec taps Qwen3 the same way).
REFERENCE_LAYER_IDS = {
    "Qwen3-4B": [1, 9, 17, 25, 33],
    "Qwen3-8B": [1, 9, 17, 25, 33],
    "Qwen3-14B": [1, 10, 19, 28, 37],
    "Qwen3-32B": [1, 16, 31, 46, 61],
    "Qwen3-30B-A3B": [1, 12, 23, 34, 45],
    "Qwen3-235B-A22B": [1, 24, 46, 68, 91],
}


def qwen3_reference_configs() -> dict[str, Qwen3Config]:
    """Model name -> ``Qwen3Config`` for the dense targets (Qwen3-4B, 8B, 14B, 32B)."""
    return {
        name: Qwen3Config(**{**_COMMON, "architectures": ["Qwen3ForCausalLM"], **sizes})
        for name, sizes in _DENSE.items()
    }


def qwen3_moe_reference_configs() -> dict[str, Qwen3MoeConfig]:
    """Model name -> ``Qwen3MoeConfig`` for Qwen3-30B-A3B and Qwen3-235B-A22B."""
    return {
        name: Qwen3MoeConfig(**{**_COMMON, "architectures": ["Qwen3MoeForCausalLM"], **_MOE_COMMON, **sizes})
        for name, sizes in _MOE.items()
    }


def reference_configs() -> dict[str, Any]:
    """Every production target's config, dense and mixture-of-experts, by model name."""
    return qwen3_reference_configs() | qwen3_moe_reference_configs()
