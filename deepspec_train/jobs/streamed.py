"""The streamed job (``topology.target_workers = T > 0``), per role: target groups compute and send features,
drafter workers train on them.

Ranks ``< T`` are target ranks, in groups of ``topology.target_tp`` (``streaming.roles``): each group loads the
data and one replica of the target (the whole target on one rank, or one tensor-parallel shard per rank,
``target.tensor_parallel``) and streams each served drafter its micro-batches (``streaming.target_worker``), built
from the same ``jobs.assembly`` step plans and chunk builder a colocated rank with that drafter's index would use.
The other ranks are drafter workers: they read only the target's config, embedding and LM-head weights (never
its decoder layers, never the data), receive features (``StreamedFeatureSource``) and finish like a colocated
job (``train_and_finish``), with gradients synchronised over the drafter ranks only.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.jobs.assembly import (
    chunk_builder, load_token_datasets, start_job, total_steps_for, train_and_finish, train_plan, validation_plan,
)
from deepspec_train.jobs.drafter_init import initialise_from
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.console import get_logger, speak_for_role
from deepspec_train.models.draft_vocab import count_supervised_tokens
from deepspec_train.kinds.builder import build_drafter_from_files
from deepspec_train.streaming.roles import Topology
from deepspec_train.streaming.streamed_source import StreamedFeatureSource
from deepspec_train.streaming.target_worker import DrafterFeed, run_target_loop
from deepspec_train.streaming.watchdog import PeerFailure, PeerMonitor, abort, is_peer_error
from deepspec_train.streaming.wire import StreamPlan
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.target.tensor_parallel import load_target_tensor_parallel
from deepspec_train.training.distributed import DistContext, new_groups, role_context
from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE, Preempted, StopWatch, tell_target_workers
from deepspec_train.training.trainer import TrainSummary

log = get_logger("deepspec_train.streaming")


def run_streamed(cfg: RecipeConfig, world: DistContext, out_dir: Path) -> Optional[TrainSummary]:
    """Run this rank's role; returns the summary on drafter workers (None on target ranks)."""
    # The launcher's processes per node (torchrun, srun): failures then name the node of a lost peer.
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world.world_size))
    topology = Topology.from_world(world.world_size, cfg.topology.target_workers, cfg.topology.target_tp, per_node)
    ctx = role_context(world, topology.target_ranks)
    # Each role's rank 0 logs: the drafters' resume, progress and summary lines come from drafter worker 0.
    speak_for_role(ctx.is_main)
    tp_group = None
    if topology.tp > 1:
        groups = [topology.group_ranks(g) for g in range(topology.num_targets)]
        tp_group = new_groups(groups, cfg.stream.timeout_s)
    me = topology.describe(world.rank)
    monitor = PeerMonitor(world.rank, world.world_size, cfg.stream.timeout_s, topology.describe).start()
    is_target = topology.role_of(world.rank) == "target"
    leave = partial(_leave_with_the_drafters, monitor, world.rank) if is_target else None
    watch = StopWatch(world.rank, leave).start()
    try:
        if is_target:
            run_target_role(cfg, ctx, world.rank, topology, tp_group)
            summary = None
        else:
            try:
                summary = run_drafter_role(cfg, ctx, topology, out_dir)
            except Preempted:
                # Every drafter has checkpointed the same step: the target workers drop what they had queued.
                tell_target_workers(topology.target_ranks)
                watch.close()
                monitor.finish()
                # As the target workers do: tearing down groups whose peers hold unfinished sends can block.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(PREEMPTED_EXIT_CODE)
    except PeerFailure as exc:
        # The peer this rank waited for may only have left (or gone silent, waiting in a collective) because
        # another one died first: let the heartbeats name a dead peer before blaming the one waited for. A peer
        # that timed out has been silent as long as a dead one would be, so a beat and a half tells them apart.
        monitor.name_the_dead_peer(f"{me}: {exc}", (1.5 if exc.timed_out else 3) * monitor.interval_s)
    except RuntimeError as exc:
        if tp_group is not None and topology.role_of(world.rank) == "target":
            # A tensor-parallel forward failed: the heartbeats say which rank of the group left.
            group = topology.describe_group(topology.group_of(world.rank))
            monitor.name_the_dead_peer(
                f"{me}: a collective of {group} failed (a rank of the group died or hung): {str(exc).splitlines()[0]}"
            )
        # A collective (the drafters' gradient all-reduce, a barrier) that failed because a peer went away.
        if not is_peer_error(str(exc)):
            raise
        abort(f"{me}: {monitor.explain(exc)}")
    watch.close()
    # Rank 0 hosts the rendezvous store every monitor talks through: it leaves only after everybody signed off.
    monitor.finish(wait_for_peers=world.rank == 0)
    return summary


def _leave_with_the_drafters(monitor: PeerMonitor, rank: int) -> None:
    """A target worker once the drafters stopped after a preemption signal: what it still had queued or was
    computing is dropped (a resumed drafter asks for its checkpoint's next step), then it signs off (rank 0,
    hosting the store, after every peer) and exits with the preemption status."""
    monitor.finish(wait_for_peers=rank == 0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PREEMPTED_EXIT_CODE)


def run_target_role(
    cfg: RecipeConfig, ctx: DistContext, rank: int, topology: Topology, tp_group: Optional[dist.ProcessGroup] = None
) -> None:
    """One target rank: load the data and the target (its shard in a tensor-parallel group ``tp_group``), then
    compute every served drafter's micro-batches; the group's first rank sends them."""
    group = topology.group_of(rank)
    sends = rank == topology.target_rank(group)
    datasets = load_token_datasets(cfg, ctx)
    train_rows = datasets["train"]
    if tp_group is None:
        target = load_target_model(cfg.target, ctx.device)
    else:
        target = load_target_tensor_parallel(cfg.target, ctx.device, tp_group, cfg.topology.target_tp_plan)
    tap = TargetTap(target, cfg.target.layer_ids)
    drafters = topology.num_drafters
    feeds = []
    for route in topology.routes_from(group):
        validation = None
        if "validation" in datasets:
            validation = validation_plan(cfg, datasets["validation"], route.drafter, drafters)
        feeds.append(DrafterFeed(route, train_plan(cfg, train_rows, route.drafter, drafters), validation))
    counts = None
    if sends and kind_spec(cfg.drafter.kind).needs_token_counts(cfg.drafter):
        # Drafter workers never see the data, so the target counts the tokens that size the draft vocabulary.
        counts = count_supervised_tokens(train_rows, target.config.vocab_size)
    total_steps = total_steps_for(cfg, len(train_rows))
    last_step = min(total_steps, cfg.train.stop_at_step or total_steps)
    plan = StreamPlan(
        total_steps, last_step, len(train_rows) // cfg.train.global_batch_sequences,
        cfg.train.eval_every, "validation" in datasets, counts,
    )
    name = topology.describe_group(group)
    if sends:
        log.info("%s feeds drafters %s; %d steps", name, [r.drafter for r in topology.routes_from(group)], plan.total_steps)
    builder = chunk_builder(cfg, tap, ctx.device)
    report = run_target_loop(feeds, builder, plan, topology, cfg.stream, ctx.device, tp_group, sends)
    if sends:
        log.info(
            "%s done: %.1f MB sent; peak %.2f MB in flight (stream.depth = %d micro-batches)",
            name, report.bytes_sent / 1e6, report.peak_in_flight / 1e6, cfg.stream.depth,
        )


def run_drafter_role(cfg: RecipeConfig, ctx: DistContext, topology: Topology, out_dir: Path) -> TrainSummary:
    source = StreamedFeatureSource(topology, ctx, cfg.stream.timeout_s)
    # Seeded by the drafter index, as a colocated rank with that index would be, so both modes start alike.
    torch.manual_seed(cfg.run.seed + ctx.rank)
    drafter, head_weight = build_drafter_from_files(cfg, source.plan.token_counts, ctx.device)
    initialise_from(drafter, cfg)
    validation = source.validation_batches if source.plan.has_validation else None
    job = start_job(cfg, ctx, drafter, head_weight, source, validation, source.plan.total_steps, out_dir)
    return train_and_finish(job)
