"""Read the target's token embedding and LM-head weights straight from its safetensors files.

Drafter workers hold frozen copies of these two matrices and nothing else of the target (they never load its
decoder layers). Works for single-file and sharded (``model.safetensors.index.json``) checkpoints and for tied
embeddings (no ``lm_head.weight`` stored).

The embedding returned is the target's *input* embedding as its model computes it: for a family whose embedding
module scales the looked-up rows (Gemma: ``* sqrt(hidden_size)``, ``families.records.TargetFamily.embedding_scale``)
the scaled rows, in float32, so a drafter's token embeddings are what the target feeds its first layer.
"""

from __future__ import annotations

import json
from pathlib import Path

from collections.abc import Mapping
from typing import Any

import torch
from safetensors import safe_open

from deepspec_train.families.catalog import family_of

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


def input_embeddings(weight: torch.Tensor, target_config: Mapping[str, Any]) -> torch.Tensor:
    """The rows the target's embedding module outputs for each token id, given its stored ``weight``: the weight
    itself, or ``float32(weight) * scale`` for a family that scales them (what the target computes in float32;
    a bf16 target rounds the scale to bf16 first, e.g. sqrt(240) -> 15.5)."""
    family = family_of(target_config)
    scale = family.embedding_scale(target_config) if family is not None else 1.0
    return weight if scale == 1.0 else weight.float() * scale


def load_head_weights(target_path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding [V, d], lm_head [V, d]); the LM head falls back to the stored embedding when weights are
    tied (a tied head multiplies by the stored rows, never by scaled ones)."""
    locations = tensor_locations(Path(target_path))
    embed = _read(locations, EMBED_KEYS)
    if embed is None:
        raise KeyError(f"{target_path}: no token embedding among {EMBED_KEYS}")
    lm_head = _read(locations, LM_HEAD_KEYS)
    config = json.loads((Path(target_path) / "config.json").read_text())
    return input_embeddings(embed, config), (lm_head if lm_head is not None else embed)
