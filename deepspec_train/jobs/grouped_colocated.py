"""The colocated job of drafter groups (``jobs.drafter_groups``): every process loads the data and the frozen target
once, and trains every group's drafter replica on one target pass. ``run_drafter_groups`` also starts streamed
groups (``jobs.grouped_streamed``): both claim the groups' run directories the same way.

Each group is assembled exactly as a colocated run of its recipe would be (``jobs.colocated``: its drafter,
step plan, chunk builder, validation pass, trainer and run directory), except that its chunk builder's tap is a
view of one ``target.shared_pass.SharedTargetPass`` over the union of the groups' layers. The groups then train
in turn, one optimizer step each per round (``DrafterTrainer.steps``): the groups of one data order ask for the
same target forwards in a round, the first one runs them and the others read them, and the kept forwards are
dropped at the end of the round. A group that is behind the others (after a resume from checkpoints of
different steps) steps alone until it has caught up; a group that ends earlier (fewer steps, ``stop_at_step``)
writes its drafter and leaves the rounds, the others go on.

Exactness: each group seeds the global RNG as a single run would (``run.seed + rank``) before building its
drafter, and carries its own RNG state from one of its steps to the next (swapped in around each step), so its
losses and weights are those of its recipe trained alone with the same ``run.seed`` and ``run.data_seed``.

Preemption: the group whose step sees the stop request checkpoints and raises ``Preempted`` as a single run does;
the groups that trained the same round before the request was seen are checkpointed at the same step
(``DrafterTrainer.save_now``), so every group holds one checkpoint and ``train.resume=auto`` restores them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Optional

import torch
import torch.distributed as dist

from deepspec_train.config.loader import save_resolved
from deepspec_train.console import get_logger
from deepspec_train.jobs.assembly import (
    TrainingJob, chunk_builder, load_token_datasets, pass_replay, start_job, total_steps_for, train_plan,
    validation_pass,
    validation_plan,
)
from deepspec_train.jobs.drafter_groups import DrafterGroup, naming_errors, write_groups_record
from deepspec_train.jobs.grouped_streamed import run_streamed_groups
from deepspec_train.jobs.drafter_init import initialise_from
from deepspec_train.jobs.target_init import initialise_from_target
from deepspec_train.jobs.run_directory import claim_output_dir
from deepspec_train.kinds.builder import build_drafter
from deepspec_train.target.loading import load_target_model
from deepspec_train.target.shared_pass import SharedTargetPass
from deepspec_train.training import preemption
from deepspec_train.training.all_ranks_end import EndTogether
from deepspec_train.training.checkpoint import list_checkpoints
from deepspec_train.training.distributed import DistContext, barrier, init_distributed, shutdown
from deepspec_train.training.feature_source import InProcessFeatureSource
from deepspec_train.training.preemption import Preempted, StopWatch
from deepspec_train.training.trainer import TrainSummary

log = get_logger("deepspec_train.run")


class _RngState:
    """One group's global RNG state (CPU, and the device's on CUDA), kept between its steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.capture()

    def capture(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


@dataclass
class _GroupRun:
    group: DrafterGroup
    job: TrainingJob
    steps: Generator[int, None, TrainSummary]
    rng: _RngState

    @property
    def step(self) -> int:
        return self.job.trainer.step


def run_drafter_groups(groups: list[DrafterGroup]) -> dict[str, TrainSummary]:
    """Train every group in one job, colocated or streamed (``jobs.grouped_streamed``, when the groups'
    ``topology.target_workers`` > 0); returns the summaries this rank holds by label (colocated: every group's)."""
    ctx = init_distributed(groups[0].cfg.stream.timeout_s)
    preemption.install()
    if ctx.is_main:
        for group in groups:
            moved = claim_output_dir(group.cfg)
            if moved is not None:
                log.warning("group %s: run.overwrite=true: the previous run was moved to %s", group.label, moved)
            save_resolved(group.cfg, group.out_dir / "resolved_config.yaml")
        write_groups_record(groups)
    # No rank writes into a group's directory before rank 0 has claimed it.
    barrier(ctx)
    streamed = groups[0].cfg.topology.target_workers > 0
    # A streamed job watches for stop requests itself (``jobs.streamed.run_roles``).
    watch = StopWatch(ctx.rank).start() if ctx.distributed and not streamed else None
    try:
        with EndTogether(ctx.rank, ctx.world_size):
            if streamed:
                return run_streamed_groups(groups, ctx)
            return _train(groups, ctx)
    finally:
        if watch is not None:
            watch.close()
        shutdown(ctx)
        if dist.is_initialized() and not ctx.distributed:
            # The one-rank group a single-process DeepSpeed run set up for itself.
            dist.destroy_process_group()


def _train(groups: list[DrafterGroup], ctx: DistContext) -> dict[str, TrainSummary]:
    # The groups share the data section (``drafter_groups.shared_settings``): one tokenised dataset serves all.
    datasets = load_token_datasets(groups[0].cfg, ctx)
    target = load_target_model(groups[0].cfg.target, ctx.device)
    shared = SharedTargetPass(target, [g.cfg.target.layer_ids for g in groups])
    head_weight = target.get_output_embeddings().weight.detach()
    runs = []
    for group in groups:
        with naming_errors(group):
            runs.append(_start(group, ctx, datasets, target, shared, head_weight))
    if ctx.is_main:
        log.info("drafter groups: %s over one target pass (taps %s)", ", ".join(g.label for g in groups),
                 shared.layer_ids)
    summaries = _step_in_turn(runs, shared)
    if ctx.is_main:
        log.info("drafter groups: %d target forwards ran for %d asked (%.2fx fewer)", shared.forwards,
                 shared.requests, shared.requests / max(shared.forwards, 1))
    return summaries


def _start(group: DrafterGroup, ctx: DistContext, datasets: dict, target, shared: SharedTargetPass,
           head_weight: torch.Tensor) -> _GroupRun:
    """Assemble one group as ``jobs.colocated`` assembles a single run, from the global seed a single run sets."""
    cfg = group.cfg
    torch.manual_seed(cfg.run.seed + ctx.rank)
    drafter = build_drafter(cfg, target, datasets["train"])
    initialise_from(drafter, cfg)
    initialise_from_target(drafter, cfg)
    drafter = drafter.to(ctx.device)
    builder = chunk_builder(cfg, shared.view(cfg.target.layer_ids), ctx.device)
    source = InProcessFeatureSource(train_plan(cfg, datasets["train"], ctx.rank, ctx.world_size), builder,
                                    pass_replay(cfg))
    validation = None
    if "validation" in datasets:
        validation = validation_pass(validation_plan(cfg, datasets["validation"], ctx.rank, ctx.world_size), builder)
    total_steps = total_steps_for(cfg, len(datasets["train"]))
    job = start_job(cfg, ctx, drafter, head_weight, source, validation, total_steps, group.out_dir)
    return _GroupRun(group, job, job.trainer.steps(job.resume_from), _RngState(ctx.device))


def _step_in_turn(runs: list[_GroupRun], shared: SharedTargetPass) -> dict[str, TrainSummary]:
    """Rounds of one step per group (the groups furthest behind only), until every group has finished."""
    summaries: dict[str, TrainSummary] = {}
    active = list(runs)
    stopped: Optional[Preempted] = None
    while active:
        behind = min(run.step for run in active)
        for run in [r for r in active if r.step == behind]:
            run.rng.restore()
            try:
                with naming_errors(run.group):
                    next(run.steps)
            except StopIteration as done:
                summaries[run.group.label] = run.job.finish(done.value)
                active.remove(run)
            except Preempted as exc:
                run.job.sink.finish()
                stopped = exc
                active.remove(run)
            finally:
                run.rng.capture()
        shared.clear()
        if stopped is not None:
            _checkpoint_the_others(active)
            raise stopped
    return summaries


def _checkpoint_the_others(active: list[_GroupRun]) -> None:
    """After one group was preempted: a checkpoint of every other group at the step it has trained."""
    for run in active:
        run.rng.restore()
        done = [p for p in list_checkpoints(run.group.out_dir) if p.name.endswith(f"{run.step:08d}")]
        checkpoint = done[0] if done else run.job.trainer.save_now()
        if run.job.ctx.is_main:
            log.warning("group %s: stopped after step %d with the others, checkpoint %s", run.group.label, run.step,
                        checkpoint)
        run.job.sink.finish()
        run.steps.close()
