"""Drafter directories as their publishers ship them, read into what ``formats.drafter_loader`` builds from: DeepSpec's
DSpark releases, z-lab's DFlash releases, EAGLE-3 drafters written by SpecForge or by the EAGLE repository.

What differs from this project's own exports, and how it is read:

- weights: ``model.safetensors``, or shards listed by ``model.safetensors.index.json`` (``save_pretrained`` of a
  large drafter), or ``pytorch_model.bin`` (EAGLE repository releases), read with ``torch.load(weights_only=True)``
  so that the file can hold nothing but tensors;
- what a layout's publishers leave out or add (EAGLE-3 configs without tapped layer ids, an embedding shipped
  with an EAGLE-3 drafter) is completed by the layout record's ``complete_published`` (``kinds``);
- no record of the target they were trained for: instead of the fingerprint check, ``check_fits_target`` compares
  hidden size, vocabulary, tapped layers and mask token with the target's config, and a mismatch fails in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file

from deepspec_train.serving_layouts.layout_checks import PublishedDrafterError

SAFETENSORS_WEIGHTS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = "pytorch_model.bin"


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


def check_fits_target(
    vocab_tensors: tuple[str, ...], config: Mapping[str, Any], state: Mapping[str, torch.Tensor], layer_ids: list[int],
    mask_token_id: int | None, target_path: str, what: str,
) -> None:
    """Refuse, in one line, a drafter whose hidden size, vocabulary, taps or mask token do not fit the target;
    ``vocab_tensors`` names the drafter's tensors indexed by target token id (one row per target token)."""
    target = json.loads((Path(target_path) / "config.json").read_text())
    vocab, hidden, depth = int(target["vocab_size"]), int(target["hidden_size"]), int(target["num_hidden_layers"])
    problems = []
    if int(config.get("hidden_size", hidden)) != hidden:
        problems.append(f"hidden size {config['hidden_size']} vs the target's {hidden}")
    if int(config.get("vocab_size", vocab)) != vocab:
        problems.append(f"vocabulary {config['vocab_size']} vs the target's {vocab}")
    problems += [f"{name} has {int(state[name].shape[0])} rows vs the target's vocabulary {vocab}"
                 for name in vocab_tensors if name in state and int(state[name].shape[0]) != vocab]
    if any(not 0 <= k < depth for k in layer_ids):
        problems.append(f"taps target layers {layer_ids}, the target has {depth}")
    if mask_token_id is not None and not 0 <= mask_token_id < vocab:
        problems.append(f"mask token {mask_token_id} is outside the target's vocabulary {vocab}")
    if problems:
        raise PublishedDrafterError(f"{what} does not fit the target {target_path}: {'; '.join(problems)}")
