"""Transformers configs of the production targets beyond Qwen3, built locally from the published
``config.json`` values (nothing downloaded): Llama 3.1-8B-Instruct and Llama 3.3-70B-Instruct
(``LlamaForCausalLM``, llama3 RoPE scaling), Gemma 3 12B / 27B instruction-tuned text models
(``Gemma3ForCausalLM``: five sliding-window layers per global one, scaled embeddings, tied head), GPT-OSS 20B /
120B (``GptOssForCausalLM``: experts, attention sinks, alternating sliding windows, YaRN) and the DeepSeek-V3
architecture (``DeepseekV3ForCausalLM``: MLA attention, first dense layers, shared + routed experts, 61 layers)
with DeepSeek-V3's and Kimi-K2-Instruct's shapes.

``family_reference_configs()`` maps model name -> config; ``FAMILY_LAYER_IDS`` gives the DSpark taps each model
gets by the rule every family shares (``families.records.dspark_layer_ids``).
"""

from __future__ import annotations

from typing import Any

from transformers import DeepseekV3Config, Gemma3TextConfig, GptOssConfig, LlamaConfig

from deepspec_train.families.records import dspark_layer_ids

_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_LLAMA3 = dict(
    architectures=["LlamaForCausalLM"], vocab_size=128256, bos_token_id=128000,
    # <|end_of_text|>, <|eom_id|>, <|eot_id|>
    eos_token_id=[128001, 128008, 128009], max_position_embeddings=131072, rms_norm_eps=1e-5,
    rope_parameters=_LLAMA3_ROPE, hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
    mlp_bias=False, num_key_value_heads=8, head_dim=128,
)
_LLAMA = {
    "Llama-3.1-8B-Instruct": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32),
    "Llama-3.3-70B-Instruct": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                   num_attention_heads=64),
}


def _gemma3_layer_types(num_layers: int) -> list[str]:
    # Five local (sliding-window) layers, then one global layer, repeated (sliding_window_pattern 6).
    return ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(num_layers)]


_GEMMA3 = dict(
    architectures=["Gemma3ForCausalLM"], vocab_size=262208, pad_token_id=0, bos_token_id=2,
    eos_token_id=[1, 106],  # <eos>, <end_of_turn>
    max_position_embeddings=131072, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
    sliding_window=1024, tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
    # Global layers: theta 1e6 with linear scaling 8; local layers: theta 10,000 unscaled.
    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
)
_GEMMA = {
    "gemma-3-12b-it": dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                           num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256),
    "gemma-3-27b-it": dict(hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
                           num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168),
}

_GPT_OSS = dict(
    architectures=["GptOssForCausalLM"], vocab_size=201088, hidden_size=2880, intermediate_size=2880, head_dim=64,
    num_attention_heads=64, num_key_value_heads=8, num_experts_per_tok=4, sliding_window=128,
    max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True,
    eos_token_id=200002, pad_token_id=199999,  # <|return|>, <|endoftext|>
    swiglu_limit=7.0,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
)
_GPT = {
    "gpt-oss-20b": dict(num_hidden_layers=24, num_local_experts=32),
    "gpt-oss-120b": dict(num_hidden_layers=36, num_local_experts=128),
}


def _alternating_windows(num_layers: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]


_DEEPSEEK_V3_ARCH = dict(
    architectures=["DeepseekV3ForCausalLM"], hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, n_shared_experts=1, num_experts_per_tok=8, kv_lora_rank=512, q_lora_rank=1536,
    qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, norm_topk_prob=True, rms_norm_eps=1e-6,
    tie_word_embeddings=False, hidden_act="silu",
)
_DEEPSEEK = {
    "DeepSeek-V3": dict(
        vocab_size=129280, num_attention_heads=128, num_key_value_heads=128, n_routed_experts=256,
        routed_scaling_factor=2.5, n_group=8, topk_group=4, first_k_dense_replace=3, max_position_embeddings=163840,
        bos_token_id=0, eos_token_id=1,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096},
    ),
    "Kimi-K2-Instruct": dict(
        vocab_size=163840, num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384,
        routed_scaling_factor=2.827, n_group=1, topk_group=1, first_k_dense_replace=1, max_position_embeddings=131072,
        bos_token_id=163584, eos_token_id=163585,  # [BOS], [EOS]; chat turns end with <|im_end|> 163586
        rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 32.0, "beta_fast": 1.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096},
    ),
}


def llama3_reference_configs() -> dict[str, LlamaConfig]:
    return {name: LlamaConfig(**{**_LLAMA3, **sizes}) for name, sizes in _LLAMA.items()}


def gemma3_reference_configs() -> dict[str, Gemma3TextConfig]:
    return {name: Gemma3TextConfig(**{**_GEMMA3, "layer_types": _gemma3_layer_types(sizes["num_hidden_layers"]),
                                      **sizes})
            for name, sizes in _GEMMA.items()}


def gpt_oss_reference_configs() -> dict[str, GptOssConfig]:
    return {name: GptOssConfig(**{**_GPT_OSS, "layer_types": _alternating_windows(sizes["num_hidden_layers"]),
                                  **sizes})
            for name, sizes in _GPT.items()}


def deepseek_v3_reference_configs() -> dict[str, DeepseekV3Config]:
    return {name: DeepseekV3Config(**{**_DEEPSEEK_V3_ARCH, **sizes}) for name, sizes in _DEEPSEEK.items()}


def family_reference_configs() -> dict[str, Any]:
    """Every non-Qwen3 production target's config by model name."""
    return (llama3_reference_configs() | gemma3_reference_configs() | gpt_oss_reference_configs()
            | deepseek_v3_reference_configs())


FAMILY_LAYER_IDS = {name: dspark_layer_ids(config.num_hidden_layers)
                    for name, config in family_reference_configs().items()}
