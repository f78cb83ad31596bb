"""Recipe overrides that point the tiny recipes (``tiny-dspark``, ``tiny-dflash``, ``tiny-eagle3``,
``tiny-dflash2``) at the session's `test`-preset tiny world: ``world_overrides`` for a recipe that only has to
load, ``training_overrides`` for a short run that trains, evaluates and checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

# The `test` preset's target has 2 decoder layers (taps from layer 0 only) and a 512-token vocabulary.
LAYER_IDS = {"tiny-dspark": "[0]", "tiny-dflash": "[0]", "tiny-eagle3": "[0,0,0]", "tiny-dflash2": "[0]"}


def world_overrides(tiny_world: Path, recipe: str, out: Path) -> list[str]:
    """The tiny world's target, taps, training conversations and mask id; the run under ``out / 'run'``."""
    mask_id = json.loads((tiny_world / "build_report.json").read_text())["mask_token_id"]
    return [
        f"target.path={tiny_world / 'target'}",
        f"target.layer_ids={LAYER_IDS[recipe]}",
        f"data.train=[{tiny_world / 'conversations' / 'train.jsonl'}]",
        f"drafter.mask_token_id={mask_id}",
        f"run.output_dir={out / 'run'}",
    ]


def training_overrides(tiny_world: Path, recipe: str, out: Path, steps: int = 4) -> list[str]:
    """``world_overrides`` plus validation data, a data cache under ``out`` and ``steps`` steps of 4 sequences,
    evaluated and checkpointed at the last step, logged every step without W&B."""
    return world_overrides(tiny_world, recipe, out) + [
        f"data.validation=[{tiny_world / 'conversations' / 'validation.jsonl'}]",
        f"data.cache_dir={out / 'cache'}",
        f"train.max_steps={steps}",
        "train.global_batch_sequences=4",
        "train.micro_batch_sequences=2",
        f"train.eval_every={steps}",
        "train.eval_sequences=8",
        f"train.checkpoint_every={steps}",
        "anchors.num_per_sequence=8",
        "logging.log_every=1",
        "logging.wandb=false",
        "logging.progress=false",
    ]
