"""Read one target decoder layer's weights straight from the target's safetensors files, by name inside the
layer (``self_attn.q_proj.weight``, ``mlp.down_proj.weight``, ...).

A drafter that starts from target layers (``drafter.init_from_target_layers``, ``jobs.target_init``) reads them
here, so a streamed drafter worker, which never loads the target's layers, starts exactly like a colocated one.
A layer's tensors are the stored keys that end in ``layers.<i>.<name>`` under one prefix (``model.`` for the
usual causal LMs, ``model.language_model.`` for a multimodal checkpoint): a checkpoint with several such stacks
(a vision tower beside the language model) is ambiguous and refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from deepspec_train.target.head_weights import tensor_locations

_LAYER_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?)layers\.(?P<index>\d+)\.(?P<name>.+)$")


class TargetLayerError(ValueError):
    """A target checkpoint whose decoder layers cannot be read by index."""


def decoder_layer_count(target_path: str | Path) -> dict[str, int]:
    """Per prefix of a stored ``layers.<i>.`` stack, its number of layers."""
    counts: dict[str, int] = {}
    for key in tensor_locations(Path(target_path)):
        match = _LAYER_KEY.match(key)
        if match is not None:
            prefix = match["prefix"]
            counts[prefix] = max(counts.get(prefix, 0), int(match["index"]) + 1)
    return counts


def read_decoder_layer(target_path: str | Path, layer: int) -> dict[str, torch.Tensor]:
    """Target decoder layer ``layer``'s stored tensors, by name inside the layer."""
    locations = tensor_locations(Path(target_path))
    stacks = decoder_layer_count(target_path)
    if len(stacks) != 1:
        found = ", ".join(f"{prefix or '(top)'}layers: {n}" for prefix, n in sorted(stacks.items())) or "none"
        raise TargetLayerError(f"{target_path}: expected one stack of decoder layers, found {found}")
    (prefix, count), = stacks.items()
    if not 0 <= layer < count:
        raise TargetLayerError(f"{target_path}: layer {layer} is outside the target's {count} decoder layers")
    head = f"{prefix}layers.{layer}."
    state = {}
    for key, file in locations.items():
        if key.startswith(head):
            with safe_open(str(file), framework="pt") as handle:
                state[key[len(head):]] = handle.get_tensor(key)
    return state
