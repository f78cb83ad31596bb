"""The streamed job (``topology.target_workers = T > 0``), per role: target workers compute and send features,
drafter workers train on them.

Ranks ``< T`` are target workers: they load the data and the target and stream each served drafter its
micro-batches (``streaming.target_worker``), built with the same ``jobs.assembly`` feature sources a colocated
rank with that drafter's index would build. The other ranks are drafter workers: they read only the target's
config, embedding and LM-head weights (never its decoder layers, never the data), receive features
(``StreamedFeatureSource``) and finish like a colocated job (``train_and_finish``), with gradients synchronised
over the drafter ranks only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.jobs.assembly import (
    load_token_datasets, total_steps_for, train_and_finish, train_source, validation_share,
)
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.console import get_logger, speak_for_role
from deepspec_train.models.draft_vocab import count_supervised_tokens
from deepspec_train.models.factory import build_drafter_from_files
from deepspec_train.streaming.roles import Topology
from deepspec_train.streaming.streamed_source import StreamedFeatureSource
from deepspec_train.streaming.target_worker import DrafterFeed, run_target_loop
from deepspec_train.streaming.watchdog import PeerFailure, PeerMonitor, abort, is_peer_error
from deepspec_train.streaming.wire import StreamPlan
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.training.distributed import DistContext, role_context
from deepspec_train.training.trainer import TrainSummary

log = get_logger("deepspec_train.streaming")


def run_streamed(cfg: RecipeConfig, world: DistContext, out_dir: Path) -> Optional[TrainSummary]:
    """Run this rank's role; returns the summary on drafter workers (None on target workers)."""
    topology = Topology.from_world(world.world_size, cfg.topology.target_workers)
    ctx = role_context(world, topology.num_targets)
    # Each role's rank 0 logs: the drafters' resume, progress and summary lines come from drafter worker 0.
    speak_for_role(ctx.is_main)
    me = topology.describe(world.rank)
    monitor = PeerMonitor(world.rank, world.world_size, cfg.stream.timeout_s, topology.describe).start()
    try:
        if topology.role_of(world.rank) == "target":
            run_target_role(cfg, ctx, world.rank, topology)
            summary = None
        else:
            summary = run_drafter_role(cfg, ctx, topology, out_dir)
    except PeerFailure as exc:
        abort(f"{me}: {exc}")
    except RuntimeError as exc:
        # A collective (the drafters' gradient all-reduce, a barrier) that failed because a peer went away.
        if not is_peer_error(str(exc)):
            raise
        abort(f"{me}: {monitor.explain(exc)}")
    # Rank 0 hosts the rendezvous store every monitor talks through: it leaves only after everybody signed off.
    monitor.finish(wait_for_peers=world.rank == 0)
    return summary


def run_target_role(cfg: RecipeConfig, ctx: DistContext, rank: int, topology: Topology) -> None:
    datasets = load_token_datasets(cfg, ctx)
    train_rows = datasets["train"]
    target = load_target_model(cfg.target, ctx.device)
    tap = TargetTap(target, cfg.target.layer_ids)
    drafters = topology.num_drafters
    feeds = []
    for route in topology.routes_from(rank):
        train = train_source(cfg, train_rows, tap, route.drafter, drafters, ctx.device)
        validation = None
        if "validation" in datasets:
            validation = validation_share(cfg, datasets["validation"], tap, route.drafter, drafters, ctx.device)
        feeds.append(DrafterFeed(route, train, validation))
    counts = None
    if kind_spec(cfg.drafter.kind).needs_token_counts:
        # Drafter workers never see the data, so the target counts the tokens that size the draft vocabulary.
        counts = count_supervised_tokens(train_rows, target.config.vocab_size)
    total_steps = total_steps_for(cfg, len(train_rows))
    last_step = min(total_steps, cfg.train.stop_at_step or total_steps)
    plan = StreamPlan(
        total_steps, last_step, len(train_rows) // cfg.train.global_batch_sequences,
        cfg.train.eval_every, "validation" in datasets, counts,
    )
    log.info("target worker %d feeds drafters %s; %d steps", rank, [r.drafter for r in topology.routes_from(rank)], plan.total_steps)
    sent = run_target_loop(feeds, plan, topology, ctx.device, cfg.stream.depth, cfg.stream.timeout_s)
    log.info("target worker %d done: %.1f MB sent", rank, sent / 1e6)


def run_drafter_role(cfg: RecipeConfig, ctx: DistContext, topology: Topology, out_dir: Path) -> TrainSummary:
    source = StreamedFeatureSource(topology, ctx.rank, ctx.device, cfg.stream.timeout_s)
    # Seeded by the drafter index, as a colocated rank with that index would be, so both modes start alike.
    torch.manual_seed(cfg.run.seed + ctx.rank)
    drafter, head_weight = build_drafter_from_files(cfg, source.plan.token_counts, ctx.device)
    validation = source.validation_batches if source.plan.has_validation else None
    return train_and_finish(cfg, ctx, drafter, head_weight, source, validation, source.plan.total_steps, out_dir)
