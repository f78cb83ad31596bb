"""The trained-drafter directory ``<run>/drafter/``: written at the end of training, read by export and evaluation.

Two files:

- ``drafter.safetensors``: the drafter's trainable weights (fp32) plus the buffers a serving export needs (EAGLE-3's
  draft-vocabulary maps ``d2t`` / ``t2d``). Frozen copies of the target's embedding / LM head are not stored: a
  reader takes them from the target again.
- ``drafter_config.json``: what rebuilds the module: ``kind``, the recipe's ``drafter`` section, the geometry,
  the tapped ``target_layer_ids``, the ``target_path`` training used and that target's fingerprint
  (``target.fingerprint``; absent in directories written before fingerprints existed).

``write_trained_drafter`` and ``read_trained_drafter`` are the only code that knows these names.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from deepspec_train.config.schema import DrafterConfig, RecipeConfig
from deepspec_train.models.geometry import DrafterGeometry

CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "drafter.safetensors"
# Buffers that travel with the trained weights (the others are recomputed or come from the target).
SAVED_BUFFERS = ("d2t", "t2d")


@dataclass
class TrainedDrafter:
    """The contents of a trained-drafter directory: its description and its stored tensors."""

    kind: str
    drafter: DrafterConfig
    geometry: DrafterGeometry
    target_layer_ids: list[int]
    target_path: str
    weights: dict[str, torch.Tensor]
    target_fingerprint: Optional[dict[str, Any]] = None


def is_trained_drafter_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters of ``model`` by name (detached, contiguous)."""
    return {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def write_trained_drafter(
    drafter: nn.Module, cfg: RecipeConfig, path: str | Path, target_fingerprint: Optional[dict[str, Any]] = None
) -> Path:
    """Write ``drafter`` trained with recipe ``cfg`` (for the target whose fingerprint dict is given) into the
    directory ``path``; returns it."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    buffers = {name: buf.detach().contiguous() for name, buf in drafter.named_buffers() if name in SAVED_BUFFERS}
    save_file(trainable_state(drafter) | buffers, str(root / WEIGHTS_FILE))
    meta = {
        "kind": cfg.drafter.kind,
        "drafter": dataclasses.asdict(cfg.drafter),
        "geometry": dataclasses.asdict(drafter.geometry),
        "target_layer_ids": list(cfg.target.layer_ids),
        "target_path": cfg.target.path,
    }
    if target_fingerprint is not None:
        meta["target_fingerprint"] = dict(target_fingerprint)
    (root / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
    return root


def read_trained_drafter(path: str | Path) -> TrainedDrafter:
    """Read the directory ``path`` written by ``write_trained_drafter``."""
    root = Path(path)
    meta = json.loads((root / CONFIG_FILE).read_text())
    return TrainedDrafter(
        kind=str(meta["kind"]),
        drafter=DrafterConfig(**meta["drafter"]),
        geometry=DrafterGeometry(**meta["geometry"]),
        target_layer_ids=[int(i) for i in meta["target_layer_ids"]],
        target_path=str(meta.get("target_path") or ""),
        weights=load_file(str(root / WEIGHTS_FILE)),
        target_fingerprint=meta.get("target_fingerprint"),
    )
