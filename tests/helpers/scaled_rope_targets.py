"""Tiny Qwen3 target configs with each RoPE scaling transformers applies (default, linear, dynamic, YaRN in three
settings, llama3), for the RoPE and Z-Lab AutoModel tests. Trained length 64 and YaRN / llama3 originals of 16
or 32 positions, so short tests reach past them."""

from __future__ import annotations

from transformers import Qwen3Config

from tests.helpers.tiny_geometry import tiny_qwen3_config

HEAD_DIM, MAX_POS = 16, 64
SCALINGS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn-explicit": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16,
                      "attention_factor": 1.25, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 0.7,
                    "mscale_all_dim": 0.5},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
}


def scaled_config(name: str, **extra: object) -> Qwen3Config:
    """The tiny target config with the RoPE scaling ``name`` of ``SCALINGS``; ``extra`` sets other fields."""
    params = {"rope_theta": 10000.0, **SCALINGS[name]}
    return tiny_qwen3_config(head_dim=HEAD_DIM, intermediate_size=96, max_position_embeddings=MAX_POS,
                             rope_parameters=params, **extra)
