"""The streamed job (``topology.target_workers = T > 0``) of one or more drafter groups (``jobs.drafter_groups``; a
plain run is a group of one), per role: target groups compute and send features, drafter workers train on them.

Ranks ``< T`` are target ranks, in groups of ``topology.target_tp`` (``streaming.roles``): each group loads the
data and one replica of the target (the whole target on one rank, or one tensor-parallel shard per rank,
``target.tensor_parallel``) and streams each served drafter its micro-batches (``streaming.target_worker``), built
from the same ``jobs.assembly`` step plans and chunk builder a colocated rank with that drafter's index would use.
The other ranks are drafter workers: they read only the target's config, embedding and LM-head weights (never
its decoder layers, never the data), receive features (``StreamedFeatureSource``) and finish like a colocated
job (``train_and_finish``), with gradients synchronised over the drafter ranks of their group only.

The drafter ranks split evenly into the groups, in the order the groups are listed (``groups.json``): with ``N``
groups on ``W`` processes, group ``k`` is the ``D = (W - T) / N`` ranks ``T + k*D .. T + (k+1)*D - 1``, routed to
the target groups as a single streamed run of ``D`` drafters is. With several groups a target group taps the union
of their layers through one ``target.shared_pass.SharedTargetPass`` and streams each drafter the micro-batches its
group's recipe builds, cut to its layers (``serve_drafter_groups``). A drafter rank trains with its group's
config, run directory and process group (gradients, metrics and checkpoints never involve another group), so its
features, losses and weights are those of its recipe streamed alone with ``D`` drafter ranks.

A group with fewer steps stops receiving after its last step and its drafters finish (drafter files, W&B run)
while the others go on. On a preemption signal each group stops after its own step, checkpoints and tells the
target workers, which drop what they would still send it and leave once every group has stopped
(``training.preemption``). A user error on a drafter rank names its group and ends every rank
(``training.all_ranks_end``).
"""

from __future__ import annotations

import os
import sys
from functools import partial
from typing import Callable
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.jobs.assembly import (
    chunk_builder, load_token_datasets, pass_replay, start_job, total_steps_for, train_and_finish, train_plan,
    validation_plan,
)
from deepspec_train.jobs.drafter_groups import DrafterGroup, naming_errors
from deepspec_train.jobs.drafter_init import initialise_from
from deepspec_train.jobs.target_init import initialise_from_target
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.common.console import get_logger, speak_for_role
from deepspec_train.models.draft_vocab import count_supervised_tokens
from deepspec_train.kinds.builder import build_drafter_from_files
from deepspec_train.steps.chunk_builder import ChunkBuilder
from deepspec_train.streaming.roles import Topology
from deepspec_train.streaming.streamed_source import StreamedFeatureSource
from deepspec_train.streaming.target_worker import DrafterFeed, FeedGroup, run_groups_loop
from deepspec_train.streaming.watchdog import PeerFailure, PeerMonitor, abort, is_peer_error
from deepspec_train.streaming.wire import StreamPlan
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.target.shared_pass import SharedTargetPass
from deepspec_train.target.tensor_parallel import load_target_tensor_parallel
from deepspec_train.training.distributed import DistContext, new_groups, role_context
from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE, Preempted, StopWatch, tell_target_workers
from deepspec_train.training.trainer import TrainSummary

log = get_logger("deepspec_train.streaming")


def train_streamed(groups: list[DrafterGroup], world: DistContext) -> dict[str, TrainSummary]:
    """This rank's role in a streamed run of ``groups``; returns its group's summary by label on drafter ranks
    (nothing on target ranks)."""
    topology = streamed_topology(groups[0].cfg, world, len(groups))
    cfgs = [group.cfg for group in groups]
    mine = groups[topology.drafter_group_of(world.rank)] if topology.role_of(world.rank) == "drafter" else None

    def train_mine(ctx: DistContext) -> TrainSummary:
        with naming_errors(mine):
            return run_drafter_role(mine.cfg, ctx, topology, mine.out_dir)

    summary = run_roles(
        groups[0].cfg, world, topology,
        lambda ctx, tp_group: serve_drafter_groups(cfgs, ctx, world.rank, topology, tp_group),
        train_mine,
    )
    return {} if summary is None or mine is None else {mine.label: summary}


def streamed_topology(cfg: RecipeConfig, world: DistContext, drafter_groups: int = 1) -> Topology:
    """The launch's topology under ``cfg`` (its ``topology`` section), with ``drafter_groups`` drafter groups."""
    # The launcher's processes per node (torchrun, srun): failures then name the node of a lost peer.
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world.world_size))
    return Topology.from_world(world.world_size, cfg.topology.target_workers, cfg.topology.target_tp, per_node,
                               drafter_groups)


def run_roles(
    cfg: RecipeConfig, world: DistContext, topology: Topology,
    target_role: Callable[[DistContext, Optional[dist.ProcessGroup]], None],
    drafter_role: Callable[[DistContext], TrainSummary],
) -> Optional[TrainSummary]:
    """Run ``target_role`` (with the rank's role context and tensor-parallel group) or ``drafter_role`` (with the
    context of its drafter group) under the streamed mode's failure and preemption handling; ``cfg`` gives the
    stream's timeout and the tensor-parallel layout."""
    ctx = role_context(world, topology.target_ranks, topology.drafter_groups)
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
    watch = StopWatch(world.rank, leave, topology.drafter_groups).start()
    try:
        if is_target:
            target_role(ctx, tp_group)
            summary = None
        else:
            try:
                summary = drafter_role(ctx)
            except Preempted:
                # Every drafter of the group has checkpointed the same step: the target workers drop what they had
                # queued for it.
                tell_target_workers(topology.target_ranks, topology.drafter_group_of(world.rank))
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


def serve_drafter_groups(
    cfgs: list[RecipeConfig], ctx: DistContext, rank: int, topology: Topology,
    tp_group: Optional[dist.ProcessGroup] = None,
) -> None:
    """One target rank serving one drafter group per config (``cfgs[k]`` is drafter group ``k``'s recipe; they
    share the target and data sections, ``jobs.drafter_groups``): load the data and the target (its shard in a
    tensor-parallel group ``tp_group``), then compute every served drafter's micro-batches, the group's first rank
    sending them. One target forward serves every group, tapped at the union of their layers, and each group gets
    the features its recipe reads."""
    cfg = cfgs[0]
    group = topology.group_of(rank)
    sends = rank == topology.target_rank(group)
    datasets = load_token_datasets(cfg, ctx)
    train_rows = datasets["train"]
    if tp_group is None:
        target = load_target_model(cfg.target, ctx.device)
    else:
        target = load_target_tensor_parallel(cfg.target, ctx.device, tp_group, cfg.topology.target_tp_plan)
    needs_counts = [kind_spec(c.drafter.kind).needs_token_counts(c.drafter) for c in cfgs]
    counts = None
    if sends and any(needs_counts):
        # Drafter workers never see the data, so the target counts the tokens that size the draft vocabulary.
        counts = count_supervised_tokens(train_rows, target.config.vocab_size)
    # One group: a plain tap, nothing kept; several: views of one pass, cleared after every shared forward.
    shared = SharedTargetPass(target, [c.target.layer_ids for c in cfgs]) if len(cfgs) > 1 else None
    served = []
    for index, (group_cfg, needs) in enumerate(zip(cfgs, needs_counts)):
        layers = group_cfg.target.layer_ids
        tap = TargetTap(target, layers) if shared is None else shared.view(layers)
        builder = chunk_builder(group_cfg, tap, ctx.device)
        served.append(_feed_group(group_cfg, datasets, topology, group, index, builder, counts if needs else None))
    name = topology.describe_group(group)
    if sends:
        log.info("%s feeds drafters %s; %s steps", name, [r.drafter for r in topology.routes_from(group)],
                 "/".join(str(g.plan.total_steps) for g in served))
    report = run_groups_loop(served, topology, cfg.stream, ctx.device, tp_group, sends,
                             shared.clear if shared is not None else lambda: None)
    if sends:
        log.info(
            "%s done: %.1f MB sent; peak %.2f MB in flight (stream.depth = %d micro-batches)",
            name, report.bytes_sent / 1e6, report.peak_in_flight / 1e6, cfg.stream.depth,
        )
        if shared is not None:
            log.info("%s: %d target forwards ran for %d asked by %d drafter groups", name, shared.forwards,
                     shared.requests, len(cfgs))


def _feed_group(cfg: RecipeConfig, datasets: dict, topology: Topology, group: int, index: int,
                builder: ChunkBuilder, counts: Optional[torch.Tensor]) -> FeedGroup:
    """What target group ``group`` serves drafter group ``index`` (recipe ``cfg``): each fed drafter's plans, as a
    colocated rank with that drafter's index would follow them, and the plan announced to them."""
    train_rows = datasets["train"]
    drafters = topology.num_drafters
    feeds = []
    for route in topology.routes_from(group):
        validation = None
        if "validation" in datasets:
            validation = validation_plan(cfg, datasets["validation"], route.drafter, drafters)
        feeds.append(DrafterFeed(route, train_plan(cfg, train_rows, route.drafter, drafters), validation))
    total_steps = total_steps_for(cfg, len(train_rows))
    last_step = min(total_steps, cfg.train.stop_at_step or total_steps)
    plan = StreamPlan(
        total_steps, last_step, len(train_rows) // cfg.train.global_batch_sequences * cfg.train.feature_reuse,
        cfg.train.eval_every, "validation" in datasets, counts,
    )
    return FeedGroup(feeds, builder, plan, index)


def run_drafter_role(cfg: RecipeConfig, ctx: DistContext, topology: Topology, out_dir: Path) -> TrainSummary:
    source = StreamedFeatureSource(topology, ctx, cfg.stream.timeout_s, pass_replay(cfg))
    # Seeded by the drafter index, as a colocated rank with that index would be, so both modes start alike.
    torch.manual_seed(cfg.run.seed + ctx.rank)
    drafter, head_weight = build_drafter_from_files(cfg, source.plan.token_counts, ctx.device)
    initialise_from(drafter, cfg)
    initialise_from_target(drafter, cfg)
    validation = source.validation_batches if source.plan.has_validation else None
    job = start_job(cfg, ctx, drafter, head_weight, source, validation, source.plan.total_steps, out_dir)
    return train_and_finish(job)
