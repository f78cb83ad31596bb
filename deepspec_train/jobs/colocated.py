"""The colocated job (``topology.target_workers=0``): every process loads the data and the frozen target once,
computes the features itself and trains its data-parallel replica of every group's drafter (``jobs.drafter_groups``;
a plain run is a group of one).

Each group is assembled from ``jobs.assembly`` as its recipe says (its drafter, step plan, chunk builder,
validation pass, trainer and run directory). A plain run's chunk builder taps the target itself; in a group run
the builders' taps are views of one ``target.shared_pass.SharedTargetPass`` over the union of the groups' layers.
The groups then train in turn, one optimizer step each per round (``DrafterTrainer.steps``): the groups of one
data order ask for the same target forwards in a round, the first one runs them and the others read them, and the
kept forwards are dropped at the end of the round. A group that is behind the others (after a resume from
checkpoints of different steps) steps alone until it has caught up; a group that ends earlier (fewer steps,
``stop_at_step``) writes its drafter and leaves the rounds, the others go on.

Exactness: each group seeds the global RNG (``run.seed + rank``) right before building its drafter, and carries
its own RNG state from one of its steps to the next (swapped in around each step), so its losses and weights are
those of its recipe trained alone with the same ``run.seed`` and ``run.data_seed``.

Preemption: the group whose step sees the stop request checkpoints and raises ``Preempted``; the groups that
trained the same round before the request was seen are checkpointed at the same step (``DrafterTrainer.save_now``),
so every group holds one checkpoint and ``train.resume=auto`` restores them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, Optional

import torch
from torch import nn

from deepspec_train.common.console import get_logger
from deepspec_train.jobs.assembly import (
    TrainingJob, chunk_builder, load_token_datasets, pass_replay, start_job, total_steps_for, train_plan,
    validation_pass,
    validation_plan,
)
from deepspec_train.jobs.drafter_groups import DrafterGroup, naming_errors
from deepspec_train.jobs.drafter_init import initialise_from
from deepspec_train.jobs.target_init import initialise_from_target
from deepspec_train.kinds.builder import build_drafter
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.target.shared_pass import SharedTargetPass, TapView
from deepspec_train.training.checkpoint import list_checkpoints
from deepspec_train.training.distributed import DistContext
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


def train_colocated(groups: list[DrafterGroup], ctx: DistContext) -> dict[str, TrainSummary]:
    """Train every group on this rank; returns every group's summary by label."""
    # A preemption signal sent to one rank reaches the others through the rendezvous store.
    watch = StopWatch(ctx.rank).start() if ctx.distributed else None
    try:
        return _train(groups, ctx)
    finally:
        if watch is not None:
            watch.close()


def _train(groups: list[DrafterGroup], ctx: DistContext) -> dict[str, TrainSummary]:
    # The groups share the data section (``drafter_groups.shared_settings``): one tokenised dataset serves all.
    datasets = load_token_datasets(groups[0].cfg, ctx)
    target = load_target_model(groups[0].cfg.target, ctx.device)
    # A plain run keeps nothing: its forwards are asked for once, so a shared pass would only hold them longer.
    shared = None if groups[0].alone else SharedTargetPass(target, [g.cfg.target.layer_ids for g in groups])
    head_weight = target.get_output_embeddings().weight.detach()
    runs = []
    for group in groups:
        layers = group.cfg.target.layer_ids
        tap = TargetTap(target, layers) if shared is None else shared.view(layers)
        with naming_errors(group):
            runs.append(_start(group, ctx, datasets, target, tap, head_weight))
    if shared is None:
        return _step_in_turn(runs, lambda: None)
    if ctx.is_main:
        log.info("drafter groups: %s over one target pass (taps %s)", ", ".join(g.label for g in groups),
                 shared.layer_ids)
    summaries = _step_in_turn(runs, shared.clear)
    if ctx.is_main:
        log.info("drafter groups: %d target forwards ran for %d asked (%.2fx fewer)", shared.forwards,
                 shared.requests, shared.requests / max(shared.forwards, 1))
    return summaries


def _start(group: DrafterGroup, ctx: DistContext, datasets: dict, target: nn.Module, tap: TargetTap | TapView,
           head_weight: torch.Tensor) -> _GroupRun:
    """Assemble one group from ``jobs.assembly``, its drafter built from its own seed (``run.seed + rank``)."""
    cfg = group.cfg
    torch.manual_seed(cfg.run.seed + ctx.rank)
    drafter = build_drafter(cfg, target, datasets["train"])
    initialise_from(drafter, cfg)
    initialise_from_target(drafter, cfg)
    drafter = drafter.to(ctx.device)
    builder = chunk_builder(cfg, tap, ctx.device)
    source = InProcessFeatureSource(train_plan(cfg, datasets["train"], ctx.rank, ctx.world_size), builder,
                                    pass_replay(cfg))
    validation = None
    if "validation" in datasets:
        validation = validation_pass(validation_plan(cfg, datasets["validation"], ctx.rank, ctx.world_size), builder)
    total_steps = total_steps_for(cfg, len(datasets["train"]))
    job = start_job(cfg, ctx, drafter, head_weight, source, validation, total_steps, group.out_dir)
    return _GroupRun(group, job, job.trainer.steps(job.resume_from), _RngState(ctx.device))


def _step_in_turn(runs: list[_GroupRun], end_round: Callable[[], None]) -> dict[str, TrainSummary]:
    """Rounds of one step per group (the groups furthest behind only), until every group has finished;
    ``end_round`` drops what the round's forwards kept."""
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
        end_round()
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
