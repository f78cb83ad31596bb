"""Checks the scale-model tiers share (Qwen3's ``tests/test_scale_tier.py`` and the other families'
``tests/test_family_scale_tier.py``): which recipe keys a tier may change, and the disk the final checkpoint takes."""

from __future__ import annotations

import shutil
from pathlib import Path

# The recipe keys the tier may change: paths, sizes, step count, the logging of a test run, and the topology: one
# target worker without a tensor-parallel group (groups are tested in test_target_groups.py).
CHANGED_KEYS = {
    "target.path", "data.train", "data.validation", "data.cache_dir", "data.max_length", "data.num_workers",
    "train.max_steps", "train.global_batch_sequences", "train.eval_every", "train.eval_sequences",
    "logging.wandb", "logging.progress", "logging.log_every", "run.output_dir", "topology.target_workers",
    "topology.target_tp",
}

def drop_final_checkpoint(run_dir: Path) -> None:
    """The run ends with a checkpoint (weights + Adam state: about 0.9 GB for a DSpark drafter's V x r Markov
    factors); the tier checks it was written, then frees the disk."""
    final = run_dir / "checkpoints" / "step_00000002"
    assert (final / "trainer_state.json").is_file()
    shutil.rmtree(final)


def flat_config(tree: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
