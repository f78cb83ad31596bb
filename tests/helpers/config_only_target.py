"""A target folder holding only ``config.json``: all that recipe validation (``train.py ... --dry-run``) reads of a
target, so commands that validate without loading can be tested without building the tiny world."""

from __future__ import annotations

import json
from pathlib import Path

# The shape of the tiny world's `small` target (5 decoder layers: the tiny recipes tap layers 1 and 3).
TINY_TARGET_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 5, "hidden_size": 256,
    "intermediate_size": 704, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096,
    "tie_word_embeddings": True,
}


def write_config_only_target(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_TARGET_CONFIG))
    return folder
