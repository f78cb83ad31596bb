"""One optimizer step's loss accumulation on the tiny DSpark, the way the trainer runs it: for tests that compare
the gradient of the same step under different packings or input dtypes."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.metrics.acceptance import PositionStats
from deepspec_train.metrics.sinks import NoOpSink
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.distributed import DistContext
from deepspec_train.training.feature_source import StepBatches
from deepspec_train.training.trainer import DrafterTrainer
from tests.helpers.tiny_drafter import LAYER_IDS, drafter_config, tiny_drafter
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, VOCAB

SINGLE = DistContext(0, 1, 0, torch.device("cpu"), None)


def tiny_recipe() -> RecipeConfig:
    """A recipe of the tiny DSpark: fp32 target, no mixed precision, small loss chunks."""
    cfg = RecipeConfig()
    target = dataclasses.replace(cfg.target, layer_ids=list(LAYER_IDS), dtype="float32")
    train = dataclasses.replace(cfg.train, mixed_precision="no")
    loss = dataclasses.replace(cfg.loss, chunk_size=16)
    return dataclasses.replace(cfg, target=target, train=train, loss=loss, drafter=drafter_config("dspark"))


def target_head(seed: int = 1) -> torch.Tensor:
    """A random frozen target LM head ``[V, d]``."""
    return torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(seed))


def accumulate_step(batches: Sequence[PackedBatch]) -> tuple[float, list[torch.Tensor]]:
    """The step's loss and the drafter's gradients after the trainer accumulated ``batches`` (a fresh tiny DSpark,
    the same weights every call)."""
    cfg = tiny_recipe()
    loss = DrafterLoss.for_recipe(cfg, target_head(), "sdpa")
    trainer = DrafterTrainer(cfg, tiny_drafter("dspark").train(), loss, None, None, NoOpSink(), SINGLE, 1)
    value, _ = trainer._accumulate(StepBatches.of(list(batches)), PositionStats(BLOCK))
    return value, [p.grad.clone() for p in trainer.model.parameters() if p.requires_grad]
