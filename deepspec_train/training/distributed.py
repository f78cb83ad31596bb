"""Process-group setup for launches by torchrun, accelerate or Slurm.

The project sets its process groups up itself: ``accelerate launch --multi_gpu`` on a CPU-only machine starts
the processes with RANK / WORLD_SIZE set but ``Accelerator()`` then reports no distributed type, so relying on
it would silently train unsynchronised replicas. gloo is used on CPU and NCCL on GPU, same code otherwise.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    """This process inside its role: ``rank`` / ``world_size`` count the ranks of the role (all ranks when
    colocated; the target workers or the drafter workers in streamed mode) and ``group`` is the role's process
    group (None for one process), which every collective of the role runs over."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    group: Optional[dist.ProcessGroup]

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(timeout_s: float = 300.0) -> DistContext:
    """Initialise the default process group from the launcher's environment (a no-op for one process)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    group = dist.group.WORLD if world_size > 1 else None
    return DistContext(rank, world_size, local_rank, device, group)


def role_context(world: DistContext, num_targets: int, drafter_groups: int = 1) -> DistContext:
    """This rank's context inside its role (streamed mode: ranks ``< num_targets`` are target workers).

    ``rank`` / ``world_size`` become the index and count within the role and ``group`` the role's own process
    group, so the drafters' gradient all-reduce, barriers and checkpoints never involve target workers (for a
    target worker that group is the target workers', used for barriers around data preparation). With
    ``drafter_groups`` > 1 (a run of drafter groups, ``streaming.roles``) the drafter ranks split evenly into that
    many consecutive groups and a drafter's role is its own group: groups never wait on each other.
    Every rank must call this, in the same order: ``new_group`` is collective over the whole world.
    """
    target_ranks = list(range(num_targets))
    target_group = dist.new_group(target_ranks)
    per_group = (world.world_size - num_targets) // drafter_groups
    mine: Optional[DistContext] = None
    for k in range(drafter_groups):
        first = num_targets + k * per_group
        group = dist.new_group(list(range(first, first + per_group)))
        if first <= world.rank < first + per_group:
            mine = DistContext(world.rank - first, per_group, world.local_rank, world.device, group)
    if world.rank < num_targets:
        return DistContext(world.rank, len(target_ranks), world.local_rank, world.device, target_group)
    assert mine is not None
    return mine


def all_reduce_sum(value: float, ctx: DistContext) -> float:
    """Sum a Python number over the ranks of this role."""
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, group=ctx.group)
    return float(t.item())


def all_reduce_max(values: list[float], ctx: DistContext) -> list[float]:
    """Element-wise maximum of a list of Python numbers over the ranks of this role."""
    if not ctx.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return t.tolist()


def new_groups(rank_lists: list[list[int]], timeout_s: float) -> Optional[dist.ProcessGroup]:
    """One process group per list of ranks (collective: every rank of the world calls it with the same lists);
    returns the group this rank belongs to, None if none. Collectives in these groups fail after ``timeout_s``."""
    mine = None
    for ranks in rank_lists:
        group = dist.new_group(ranks, timeout=datetime.timedelta(seconds=timeout_s))
        if dist.get_rank() in ranks:
            mine = group
    return mine


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier(group=ctx.group)


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()
