"""Transformers configs of the production targets (Qwen3-4B, 8B, 14B), built locally without the hub.

Used by shape tests (drafters instantiated on the meta device) and by recipes that need the target geometry
without downloading a checkpoint. Sizes are the published ones of each model's ``config.json``.
"""

from __future__ import annotations

from transformers import Qwen3Config

_COMMON = dict(
    architectures=["Qwen3ForCausalLM"],
    vocab_size=151936,
    # <|endoftext|> and <|im_end|> (the tokenizer's end of turn), as in every Qwen3 config.json.
    bos_token_id=151643,
    eos_token_id=151645,
    head_dim=128,
    num_key_value_heads=8,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    hidden_act="silu",
)

_SIZES = {
    "Qwen3-4B": dict(
        hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, intermediate_size=9728,
        tie_word_embeddings=True,
    ),
    "Qwen3-8B": dict(
        hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, intermediate_size=12288,
        tie_word_embeddings=False,
    ),
    "Qwen3-14B": dict(
        hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, intermediate_size=17408,
        tie_word_embeddings=False,
    ),
}

# Context taps evenly spaced from decoder layer 1 to L-3 (never the last layers), as DeepSpec taps Qwen3.
REFERENCE_LAYER_IDS = {
    "Qwen3-4B": [1, 9, 17, 25, 33],
    "Qwen3-8B": [1, 9, 17, 25, 33],
    "Qwen3-14B": [1, 10, 19, 28, 37],
}


def qwen3_reference_configs() -> dict[str, Qwen3Config]:
    """Model name -> ``Qwen3Config`` for Qwen3-4B, Qwen3-8B and Qwen3-14B."""
    return {name: Qwen3Config(**_COMMON, **sizes) for name, sizes in _SIZES.items()}
