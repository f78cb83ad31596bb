"""Drafter directories as their publishers ship them, read into what ``export.loader`` builds from: DeepSpec's
DSpark releases, z-lab's DFlash releases, EAGLE-3 drafters written by SpecForge or by the EAGLE repository.

What differs from this project's own exports, and how it is read:

- weights: ``model.safetensors``, or shards listed by ``model.safetensors.index.json`` (``save_pretrained`` of a
  large drafter), or ``pytorch_model.bin`` (EAGLE repository releases), read with ``torch.load(weights_only=True)``
  so that the file can hold nothing but tensors;
- EAGLE-3 configs without tapped layer ids (the EAGLE repository's): the engines' default, outputs of target
  decoder layers ``[1, L//2 - 1, L - 4]`` (``FORMATS.md``), from the target's depth; an ``embed_tokens.weight``
  shipped with an EAGLE-3 drafter is dropped after its shape is checked, since the target's embedding is the
  one used;
- no record of the target they were trained for: instead of the fingerprint check, ``check_fits_target`` compares
  hidden size, vocabulary, tapped layers and mask token with the target's config, and a mismatch fails in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file

from deepspec_train.errors import UserError

SAFETENSORS_WEIGHTS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = "pytorch_model.bin"
EAGLE3_EMBEDDING = "embed_tokens.weight"


class PublishedDrafterError(UserError, ValueError):
    """A drafter directory that cannot be read, or that does not fit the target it is used with."""


def read_drafter_weights(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the drafter in ``root``, from whichever weight files it holds (see the module docstring)."""
    if (root / SAFETENSORS_WEIGHTS).is_file():
        return load_file(str(root / SAFETENSORS_WEIGHTS))
    if (root / SHARD_INDEX).is_file():
        weight_map = json.loads((root / SHARD_INDEX).read_text()).get("weight_map") or {}
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if not (root / shard).is_file():
                raise PublishedDrafterError(f"{root / SHARD_INDEX} lists the shard {shard}, which is missing")
            state.update(load_file(str(root / shard)))
        missing = sorted(set(weight_map) - set(state))
        if missing:
            raise PublishedDrafterError(f"{root}: tensors {missing[:3]} of {SHARD_INDEX} are in none of its shards")
        return state
    if (root / PICKLE_WEIGHTS).is_file():
        try:
            state = torch.load(root / PICKLE_WEIGHTS, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises UnpicklingError, RuntimeError or EOFError for a bad file
            raise PublishedDrafterError(f"{root / PICKLE_WEIGHTS}: not a plain tensor checkpoint ({error})") from None
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise PublishedDrafterError(f"{root / PICKLE_WEIGHTS} does not hold a name -> tensor mapping")
        return state
    raise PublishedDrafterError(
        f"{root}: no drafter weights ({SAFETENSORS_WEIGHTS}, {SHARD_INDEX} or {PICKLE_WEIGHTS})")


def target_config_of(target_path: str | Path) -> dict[str, Any]:
    return json.loads((Path(target_path) / "config.json").read_text())


def default_eagle3_layer_ids(num_target_layers: int) -> list[int]:
    """The engines' EAGLE-3 taps when a config names none: outputs of decoder layers ``[1, L//2 - 1, L - 4]``."""
    return [1, num_target_layers // 2 - 1, num_target_layers - 4]


def complete_eagle3_checkpoint(
    config: dict[str, Any], state: dict[str, torch.Tensor], target_path: str | None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """An EAGLE-3 config and state as the loader reads them: tapped layers named, no embedding of its own."""
    config, state = dict(config), dict(state)
    eagle = config.get("eagle_config") or {}
    if "eagle_aux_hidden_state_layer_ids" not in config and "eagle_aux_hidden_state_layer_ids" not in eagle:
        if not target_path:
            raise PublishedDrafterError("this EAGLE-3 config names no tapped target layers: pass the target so the "
                                        "engines' default taps can be derived from its depth")
        layers = int(target_config_of(target_path)["num_hidden_layers"])
        config["eagle_config"] = {**eagle, "eagle_aux_hidden_state_layer_ids": default_eagle3_layer_ids(layers),
                                  "use_aux_hidden_state": True}
    embedding = state.pop(EAGLE3_EMBEDDING, None)
    if embedding is not None and target_path:
        target = target_config_of(target_path)
        expected = (int(target["vocab_size"]), int(target["hidden_size"]))
        if tuple(embedding.shape) != expected:
            raise PublishedDrafterError(f"the EAGLE-3 drafter does not fit the target {target_path}: its "
                                        f"{EAGLE3_EMBEDDING} is {tuple(embedding.shape)}, the target's embedding "
                                        f"(vocabulary x hidden) is {expected}")
    return config, state


def _vocab_rows(layout: str, state: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Rows of the tensors indexed by target token id, per layout."""
    names = {"dspark": ("embed_tokens.weight", "lm_head.weight", "markov_head.markov_w1.weight"),
             "eagle3": ("t2d",),
             # A training output holds the trainable tensors and the EAGLE-3 maps only.
             "training": ("markov_head.markov_w1.weight", "t2d")}.get(layout, ())
    return {name: int(state[name].shape[0]) for name in names if name in state}


def check_fits_target(
    layout: str, config: Mapping[str, Any], state: Mapping[str, torch.Tensor], layer_ids: list[int],
    mask_token_id: int | None, target_path: str, what: str,
) -> None:
    """Refuse, in one line, a drafter whose hidden size, vocabulary, taps or mask token do not fit the target."""
    target = target_config_of(target_path)
    vocab, hidden, depth = int(target["vocab_size"]), int(target["hidden_size"]), int(target["num_hidden_layers"])
    problems = []
    if int(config.get("hidden_size", hidden)) != hidden:
        problems.append(f"hidden size {config['hidden_size']} vs the target's {hidden}")
    if int(config.get("vocab_size", vocab)) != vocab:
        problems.append(f"vocabulary {config['vocab_size']} vs the target's {vocab}")
    problems += [f"{name} has {rows} rows vs the target's vocabulary {vocab}"
                 for name, rows in _vocab_rows(layout, state).items() if rows != vocab]
    if any(not 0 <= k < depth for k in layer_ids):
        problems.append(f"taps target layers {layer_ids}, the target has {depth}")
    if mask_token_id is not None and not 0 <= mask_token_id < vocab:
        problems.append(f"mask token {mask_token_id} is outside the target's vocabulary {vocab}")
    if problems:
        raise PublishedDrafterError(f"{what} does not fit the target {target_path}: {'; '.join(problems)}")
