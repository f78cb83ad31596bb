"""The colocated job (``topology.target_workers=0``): every process loads the data and the frozen target, computes
its own features and trains its data-parallel drafter replica on them."""

from __future__ import annotations

from pathlib import Path

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.jobs.assembly import (
    chunk_builder, load_token_datasets, pass_replay, start_job, total_steps_for, train_and_finish, train_plan,
    validation_pass,
    validation_plan,
)
from deepspec_train.jobs.drafter_init import initialise_from
from deepspec_train.jobs.target_init import initialise_from_target
from deepspec_train.kinds.builder import build_drafter
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.training.distributed import DistContext
from deepspec_train.training.feature_source import InProcessFeatureSource
from deepspec_train.training.preemption import StopWatch
from deepspec_train.training.trainer import TrainSummary


def run_colocated(cfg: RecipeConfig, ctx: DistContext, out_dir: Path) -> TrainSummary:
    # A preemption signal sent to one rank reaches the others through the rendezvous store.
    watch = StopWatch(ctx.rank).start() if ctx.distributed else None
    try:
        return _train(cfg, ctx, out_dir)
    finally:
        if watch is not None:
            watch.close()


def _train(cfg: RecipeConfig, ctx: DistContext, out_dir: Path) -> TrainSummary:
    datasets = load_token_datasets(cfg, ctx)
    target = load_target_model(cfg.target, ctx.device)
    tap = TargetTap(target, cfg.target.layer_ids)
    drafter = build_drafter(cfg, target, datasets["train"])
    initialise_from(drafter, cfg)
    initialise_from_target(drafter, cfg)
    drafter = drafter.to(ctx.device)
    head_weight = target.get_output_embeddings().weight.detach()
    builder = chunk_builder(cfg, tap, ctx.device)
    source = InProcessFeatureSource(train_plan(cfg, datasets["train"], ctx.rank, ctx.world_size), builder,
                                    pass_replay(cfg))
    validation = None
    if "validation" in datasets:
        validation = validation_pass(validation_plan(cfg, datasets["validation"], ctx.rank, ctx.world_size), builder)
    total_steps = total_steps_for(cfg, len(datasets["train"]))
    return train_and_finish(start_job(cfg, ctx, drafter, head_weight, source, validation, total_steps, out_dir))
