"""Run one training job from a validated recipe: set up the process group, claim the output directory (one run
per directory, ``jobs.run_directory``) and write the resolved config, then hand over to the colocated job
(``topology.target_workers=0``) or the streamed one. Nothing else happens here."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from deepspec_train.config.loader import save_resolved
from deepspec_train.console import get_logger
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.jobs.colocated import run_colocated
from deepspec_train.jobs.run_directory import claim_output_dir
from deepspec_train.jobs.streamed import run_streamed
from deepspec_train.training import preemption
from deepspec_train.training.all_ranks_end import EndTogether
from deepspec_train.training.distributed import barrier, init_distributed, shutdown
from deepspec_train.training.trainer import TrainSummary

log = get_logger("deepspec_train.run")


def run_training(cfg: RecipeConfig) -> Optional[TrainSummary]:
    """Train as this process's role; returns the summary on drafter ranks (None on target workers)."""
    ctx = init_distributed(cfg.stream.timeout_s)
    preemption.install()
    torch.manual_seed(cfg.run.seed + ctx.rank)
    out_dir = Path(cfg.run.output_dir)
    if ctx.is_main:
        moved = claim_output_dir(cfg)
        if moved is not None:
            log.warning("run.overwrite=true: the previous run in %s was moved to %s", out_dir, moved)
        save_resolved(cfg, out_dir / "resolved_config.yaml")
    # No rank writes into the directory before rank 0 has claimed it (and moved an old run aside).
    barrier(ctx)
    try:
        # A user error on one rank ends every rank (``training.all_ranks_end``), before any group is torn down.
        with EndTogether(ctx.rank, ctx.world_size):
            if cfg.topology.target_workers > 0:
                return run_streamed(cfg, ctx, out_dir)
            return run_colocated(cfg, ctx, out_dir)
    finally:
        shutdown(ctx)
        if dist.is_initialized() and not ctx.distributed:
            # The one-rank group a single-process DeepSpeed run set up for itself.
            dist.destroy_process_group()
