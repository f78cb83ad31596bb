"""DSpark and DFlash drafters for Qwen3-4B/8B/14B, built on the meta device, have the tensor shapes of the DSpark serving layout (DeepSpec's release format)."""

from __future__ import annotations

import pytest
import torch

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.models.reference_configs import (
    REFERENCE_LAYER_IDS, evenly_spaced_layer_ids, qwen3_reference_configs, reference_configs,
)

CONFIGS = qwen3_reference_configs()


def expected_shapes(cfg, num_layers: int, num_taps: int, rank: int, confidence: bool) -> dict[str, tuple]:
    """Tensor name -> shape in the DSpark layout (DFlash trained with DSpark labels: rank 0, no head)."""
    d, v, i, h = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.head_dim
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = {
        "fc.weight": (d, num_taps * d),
        "hidden_norm.weight": (d,),
        "norm.weight": (d,),
        "embed_tokens.weight": (v, d),
        "lm_head.weight": (v, d),
    }
    for n in range(num_layers):
        p = f"layers.{n}."
        shapes.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (heads * h, d),
                p + "self_attn.k_proj.weight": (kv_heads * h, d),
                p + "self_attn.v_proj.weight": (kv_heads * h, d),
                p + "self_attn.o_proj.weight": (d, heads * h),
                p + "self_attn.q_norm.weight": (h,),
                p + "self_attn.k_norm.weight": (h,),
                p + "mlp.gate_proj.weight": (i, d),
                p + "mlp.up_proj.weight": (i, d),
                p + "mlp.down_proj.weight": (d, i),
            }
        )
    if rank:
        shapes["markov_head.markov_w1.weight"] = (v, rank)
        shapes["markov_head.markov_w2.weight"] = (v, rank)
    if confidence:
        shapes["confidence_head.proj.weight"] = (1, d + rank)
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("kind", ["dspark", "dflash"])
def test_meta_drafter_shapes(name, kind):
    cfg = CONFIGS[name]
    layer_ids = REFERENCE_LAYER_IDS[name]
    rank, confidence = (256, True) if kind == "dspark" else (0, False)
    drafter_cfg = DrafterConfig(kind=kind, num_layers=5, block_size=7, markov_rank=rank, confidence_head=confidence)
    with torch.device("meta"):
        model = ParallelDrafter(geometry_from_target_config(cfg), drafter_cfg, layer_ids)
    got = {k: tuple(t.shape) for k, t in model.state_dict().items()}
    assert got == expected_shapes(cfg, 5, len(layer_ids), rank, confidence)
    assert all(t.is_meta for t in model.state_dict().values())


def test_reference_configs_match_published_sizes():
    sizes = {
        n: (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) for n, c in CONFIGS.items()
    }
    assert sizes == {
        "Qwen3-4B": (2560, 36, 32, 9728),
        "Qwen3-8B": (4096, 36, 32, 12288),
        "Qwen3-14B": (5120, 40, 40, 17408),
        "Qwen3-32B": (5120, 64, 64, 25600),
    }
    assert CONFIGS["Qwen3-4B"].tie_word_embeddings and not CONFIGS["Qwen3-8B"].tie_word_embeddings
    for name, cfg in CONFIGS.items():
        geometry = geometry_from_target_config(cfg)
        assert (geometry.num_key_value_heads, geometry.head_dim, geometry.vocab_size) == (8, 128, 151936)
        assert geometry.rope_theta == 1e6
        assert max(REFERENCE_LAYER_IDS[name]) == cfg.num_hidden_layers - 3
    for name, layer_ids in REFERENCE_LAYER_IDS.items():
        assert layer_ids == evenly_spaced_layer_ids(reference_configs()[name].num_hidden_layers)


def test_geometry_reads_legacy_rope_theta_and_mlp_override():
    class LegacyConfig:
        hidden_size, num_attention_heads, num_key_value_heads, head_dim = 64, 4, 2, 16
        intermediate_size, rms_norm_eps, vocab_size, num_hidden_layers = 128, 1e-5, 100, 6
        max_position_embeddings, rope_theta, rope_parameters = 2048, 5e5, None

    geometry = geometry_from_target_config(LegacyConfig(), intermediate_size=96)
    assert geometry.rope_theta == 5e5 and geometry.intermediate_size == 96
