"""Read the target's token embedding and LM-head weights straight from its safetensors files.

Drafter workers hold frozen copies of these two matrices and nothing else of the target (they never load its
decoder layers). Works for single-file and sharded (``model.safetensors.index.json``) checkpoints and for tied
embeddings (no ``lm_head.weight`` stored).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

EMBED_KEYS = ("model.embed_tokens.weight", "embed_tokens.weight")
LM_HEAD_KEYS = ("lm_head.weight",)


def tensor_locations(path: Path) -> dict[str, Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / shard for name, shard in weight_map.items()}
    single = path / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}


def _read(locations: dict[str, Path], keys: tuple[str, ...]) -> torch.Tensor | None:
    for key in keys:
        if key in locations:
            with safe_open(str(locations[key]), framework="pt") as f:
                return f.get_tensor(key)
    return None


def load_head_weights(target_path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding [V, d], lm_head [V, d]); the LM head falls back to the embedding when weights are tied."""
    locations = tensor_locations(Path(target_path))
    embed = _read(locations, EMBED_KEYS)
    if embed is None:
        raise KeyError(f"{target_path}: no token embedding among {EMBED_KEYS}")
    lm_head = _read(locations, LM_HEAD_KEYS)
    return embed, (lm_head if lm_head is not None else embed)
