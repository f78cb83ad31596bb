"""``train.profile``: a run writes a Chrome trace of a few steps (``training.step_profiler``) and trains as usual."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from deepspec_train.metrics.sinks import NoOpSink
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.step_profiler import ACTIVE_STEPS, WAIT_STEPS, WARMUP_STEPS
from deepspec_train.training.trainer import DrafterTrainer
from tests.helpers.listed_source import ListedSource
from tests.helpers.step_trainers import SINGLE, target_head, tiny_recipe
from tests.helpers.tiny_drafter import random_item, tiny_drafter
from tests.helpers.tiny_geometry import BLOCK, MASK_ID


def test_train_profile_writes_a_trace_of_the_profiled_steps(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    items = [random_item(40, i, generator) for i in range(2)]
    batches = pack_sequences(items, [sample_anchors(i.loss_mask, 4, generator) for i in items], BLOCK, 200, MASK_ID)
    cfg = tiny_recipe()
    cfg = dataclasses.replace(
        cfg, run=dataclasses.replace(cfg.run, output_dir=str(tmp_path)),
        train=dataclasses.replace(cfg.train, profile=True, checkpoint_every=10**6),
        logging=dataclasses.replace(cfg.logging, wandb=False, progress=False),
    )
    steps = WAIT_STEPS + WARMUP_STEPS + ACTIVE_STEPS + 1
    loss = DrafterLoss.for_recipe(cfg, target_head(), "sdpa")
    trainer = DrafterTrainer(cfg, tiny_drafter("dspark").train(), loss, ListedSource([batches]), None, NoOpSink(),
                             SINGLE, steps)
    assert trainer.fit().steps == steps
    trace = json.loads((tmp_path / "profile" / "rank0.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert any(name and name.startswith("ProfilerStep#") for name in names)
