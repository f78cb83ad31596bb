"""The one tiny geometry of the unit tests: a 97-token vocabulary whose last id is the mask, width 32, 4 attention
heads over 2 key/value heads, 4 target layers, blocks of 4.

``TINY_GEOMETRY`` is the drafter's view of it and ``tiny_qwen3_config`` a Hugging Face target config of the same
shape; a test that needs another size states only the fields it changes.
"""

from __future__ import annotations

from transformers import Qwen3Config

from deepspec_train.models.geometry import DrafterGeometry

VOCAB = 97
MASK_ID = 96
HIDDEN = 32
BLOCK = 4
TARGET_LAYERS = 4
HEADS = 4
KV_HEADS = 2

TINY_GEOMETRY = DrafterGeometry(
    hidden_size=HIDDEN,
    intermediate_size=48,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    vocab_size=VOCAB,
    num_target_layers=TARGET_LAYERS,
    max_position_embeddings=512,
)


def tiny_qwen3_config(**fields: object) -> Qwen3Config:
    """A Qwen3 target config of the tiny shape; ``fields`` set the rest (head_dim, widths, RoPE) or replace any."""
    shape = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=TARGET_LAYERS, num_attention_heads=HEADS,
                 num_key_value_heads=KV_HEADS)
    return Qwen3Config(**{**shape, **fields})
