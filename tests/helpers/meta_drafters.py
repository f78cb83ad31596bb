"""Qwen3-8B-sized DSpark / DFlash drafters built on the meta device (no memory, nothing written), for the export
plan and engine-rule tests that check key names and shapes at the production size."""

from __future__ import annotations

import torch

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.formats.drafter_loader import LoadedDrafter
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS, qwen3_reference_configs

QWEN3_8B = qwen3_reference_configs()["Qwen3-8B"]


def meta_parallel(kind: str, labels: str = "dspark") -> LoadedDrafter:
    """A loaded ``kind`` drafter (5 layers, block 7, Markov rank 256 for DSpark) at Qwen3-8B's widths and taps."""
    rank, confidence = (256, True) if kind == "dspark" else (0, False)
    cfg = DrafterConfig(kind=kind, num_layers=5, block_size=7, markov_rank=rank, confidence_head=confidence,
                        labels=labels)
    with torch.device("meta"):
        module = ParallelDrafter(geometry_from_target_config(QWEN3_8B), cfg, REFERENCE_LAYER_IDS["Qwen3-8B"])
    return LoadedDrafter(module, kind, 7, REFERENCE_LAYER_IDS["Qwen3-8B"], 151669, None, labels, "training")
