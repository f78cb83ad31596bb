"""Streamed training, per role: target workers compute and send features, drafter workers train on them.

Entered from ``training.run.run_training`` when ``topology.target_workers = T > 0``. Ranks ``< T`` are target
workers: they load the data and the target, and stream each served drafter its micro-batches
(``target_worker``). The other ranks are drafter workers: they read only the target's config, embedding and
LM-head weights (never its decoder layers, never the data), receive features (``StreamedFeatureSource``) and run
the ordinary ``DrafterTrainer`` with gradients synchronised over the drafter ranks only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import nn

from deepspec_train.config.loader import config_to_dict
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.logging_utils.metrics_sink import get_logger, make_sink, speak_for_role
from deepspec_train.models.draft_vocab import count_supervised_tokens
from deepspec_train.models.eagle3_drafter import Eagle3Drafter
from deepspec_train.models.factory import build_drafter_for_geometry
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.streaming.roles import Topology
from deepspec_train.streaming.streamed_source import StreamedFeatureSource
from deepspec_train.streaming.target_worker import DrafterFeed, StreamPlan, run_target_loop
from deepspec_train.streaming.watchdog import PeerFailure, PeerMonitor, abort, is_peer_error
from deepspec_train.target.head_weights import load_head_weights
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_config, load_target_model, resolve_dtype
from deepspec_train.training.distributed import DistContext, role_context
from deepspec_train.training.feature_source import InProcessFeatureSource
from deepspec_train.training.run import (
    finish_run, load_token_datasets, packing_spec, resolve_attention, total_steps_for, validation_source,
)
from deepspec_train.training.trainer import DrafterTrainer, TrainSummary

log = get_logger("deepspec_train.streaming")


def run_streamed(cfg: RecipeConfig, world: DistContext, out_dir: Path) -> Optional[TrainSummary]:
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
    monitor.finish()
    return summary


def run_target_role(cfg: RecipeConfig, ctx: DistContext, rank: int, topology: Topology) -> None:
    datasets = load_token_datasets(cfg, ctx)
    train_rows = datasets["train"]
    target = load_target_model(cfg.target, ctx.device)
    tap = TargetTap(target, cfg.target.layer_ids)
    spec, drafters = packing_spec(cfg), topology.num_drafters
    feeds = []
    for route in topology.routes_from(rank):
        train = InProcessFeatureSource(
            train_rows, tap, spec, cfg.train.global_batch_sequences, cfg.train.micro_batch_sequences,
            cfg.run.seed, route.drafter, drafters, ctx.device,
        )
        validation, rows = None, []
        if "validation" in datasets:
            validation, rows = validation_source(cfg, datasets["validation"], tap, route.drafter, drafters, ctx.device)
        feeds.append(DrafterFeed(route, train, validation, rows))
    counts = None
    if cfg.drafter.kind == "eagle3":
        # Drafter workers never see the data, so the target counts the tokens that size EAGLE-3's draft vocabulary.
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


def build_drafter_from_files(cfg: RecipeConfig, token_counts: Optional[torch.Tensor], device: torch.device
                             ) -> tuple[nn.Module, torch.Tensor]:
    """The drafter and the frozen LM-head weight, from the target's config and safetensors only."""
    geometry = geometry_from_target_config(load_target_config(cfg.target), cfg.drafter.intermediate_size)
    drafter = build_drafter_for_geometry(cfg, geometry, token_counts)
    embed, lm_head = load_head_weights(cfg.target.path)
    if isinstance(drafter, Eagle3Drafter):
        drafter.load_target_embedding(embed.float())
    else:
        drafter.load_target_heads(embed.float(), lm_head.float())
    # The same dtype the colocated path takes from the loaded target's output embedding.
    return drafter.to(device), lm_head.to(device=device, dtype=resolve_dtype(cfg.target.dtype, device))


def run_drafter_role(cfg: RecipeConfig, ctx: DistContext, topology: Topology, out_dir: Path) -> TrainSummary:
    source = StreamedFeatureSource(topology, ctx.rank, ctx.device, cfg.stream.timeout_s)
    # Seeded by the drafter index, as a colocated rank with that index would be, so both modes start alike.
    torch.manual_seed(cfg.run.seed + ctx.rank)
    drafter, head_weight = build_drafter_from_files(cfg, source.plan.token_counts, ctx.device)
    val_batches = source.validation_batches if source.plan.has_validation else None
    sink = make_sink(out_dir, cfg.logging, cfg.run.name, config_to_dict(cfg), ctx.is_main)
    trainer = DrafterTrainer(
        cfg, drafter, head_weight, source, val_batches, sink, ctx, source.plan.total_steps, resolve_attention(ctx)
    )
    summary = trainer.fit()
    finish_run(cfg, ctx, drafter, summary, sink, out_dir)
    return summary
