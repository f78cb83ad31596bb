"""Run one training job: one or more drafter groups (``jobs.drafter_groups``) over one target. A plain run of a
recipe is a group of one (``plain_run``): every run is set up, trained and torn down by the same code.

The setup: the process group, the preemption handler, each group's run directory claimed (one run per directory,
``jobs.run_directory``) and its resolved config written, all ranks waiting for that; then the colocated job
(``topology.target_workers=0``, ``jobs.colocated``) or the streamed one (``jobs.streamed``) under
``training.all_ranks_end``, and the process group shut down whatever happens. Nothing else happens here."""

from __future__ import annotations

from typing import Optional

import torch.distributed as dist

from deepspec_train.config.loader import save_resolved
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.common.console import get_logger
from deepspec_train.jobs.colocated import train_colocated
from deepspec_train.jobs.drafter_groups import DrafterGroup, plain_run, write_groups_record
from deepspec_train.jobs.run_directory import claim_output_dir
from deepspec_train.jobs.streamed import train_streamed
from deepspec_train.training import preemption
from deepspec_train.training.all_ranks_end import EndTogether
from deepspec_train.training.distributed import barrier, init_distributed, shutdown
from deepspec_train.training.trainer import TrainSummary

log = get_logger("deepspec_train.run")


def run_training(cfg: RecipeConfig) -> Optional[TrainSummary]:
    """Train ``cfg`` as this process's role; returns the summary on drafter ranks (None on target workers)."""
    summaries = run_drafter_groups([plain_run(cfg)])
    return next(iter(summaries.values()), None)


def run_drafter_groups(groups: list[DrafterGroup]) -> dict[str, TrainSummary]:
    """Train every group in one job, colocated or streamed (when the groups' ``topology.target_workers`` > 0);
    returns the summaries this rank holds by label (colocated: every group's; streamed: its own group's on a
    drafter rank, none on a target worker)."""
    ctx = init_distributed(groups[0].cfg.stream.timeout_s)
    preemption.install()
    if ctx.is_main:
        _claim_directories(groups)
    # No rank writes into a group's directory before rank 0 has claimed it (and moved an old run aside).
    barrier(ctx)
    try:
        # A user error on one rank ends every rank (``training.all_ranks_end``), before any group is torn down.
        with EndTogether(ctx.rank, ctx.world_size):
            if groups[0].cfg.topology.target_workers > 0:
                return train_streamed(groups, ctx)
            return train_colocated(groups, ctx)
    finally:
        shutdown(ctx)
        if dist.is_initialized() and not ctx.distributed:
            # The one-rank group a single-process DeepSpeed run set up for itself.
            dist.destroy_process_group()


def _claim_directories(groups: list[DrafterGroup]) -> None:
    """Rank 0: claim every group's run directory, write its resolved config and, for a group run, ``groups.json``."""
    for group in groups:
        moved = claim_output_dir(group.cfg)
        if moved is not None:
            log.warning("%s", group.moved_aside(moved))
        save_resolved(group.cfg, group.out_dir / "resolved_config.yaml")
    if not groups[0].alone:
        write_groups_record(groups)
