"""Which rank does what in streamed mode, and which target group feeds which drafter worker at which step.

The first ``G * k`` ranks are target ranks (``topology.target_workers``), in ``G`` groups of ``k =
topology.target_tp`` consecutive ranks: group ``g`` is ranks ``g*k .. g*k+k-1`` and holds one tensor-parallel
replica of the target (``k = 1``: one target worker per group, the whole target on one rank). The first rank of a
group sends the group's features; the others only take part in its forwards. The ranks after them are drafter
workers (drafter index ``i`` is global rank ``G*k + i``). Every drafter is fed by one or more groups and every
group feeds at least one drafter:

- ``G <= D``: drafter ``i`` is fed by group ``i % G`` at every step (a group serves ``ceil(D / G)`` drafters).
- ``G > D``: drafter ``i`` is fed by the groups ``g`` with ``g % D == i``, taking turns step by step (step ``s``
  comes from the ``s % n``-th of its ``n`` groups), so extra groups add forward throughput.

A run of ``N`` drafter groups (``jobs.drafter_groups``: several recipes or seeds over one target pass) splits the
drafter ranks evenly: drafter group ``k`` is the ``D = (world size - G*tp) / N`` consecutive ranks after the
first ``k`` groups', and inside it drafter ``i`` is routed as above, so target group ``g`` feeds drafter ``i`` of every
drafter group (one forward serves them all). A single run is one drafter group.

The assignment is a pure function of (G, D, N): both sides derive it without exchanging anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["target", "drafter"]


@dataclass(frozen=True)
class Route:
    """Target group ``target`` sends drafter ``drafter`` the steps ``s`` with ``s % stride == offset``."""

    target: int
    drafter: int
    offset: int
    stride: int

    def carries(self, step: int) -> bool:
        return step % self.stride == self.offset


@dataclass(frozen=True)
class Topology:
    """``num_targets`` target groups of ``tp`` ranks each and ``drafter_groups`` drafter groups of
    ``num_drafters`` drafter workers each; with ``ranks_per_node`` set (the launcher's processes per node, the same
    on every node as ``torchrun`` and ``srun`` start them) and more than one node, peers are named with their node
    as well."""

    num_targets: int
    num_drafters: int
    tp: int = 1
    ranks_per_node: int = 0
    drafter_groups: int = 1

    def __post_init__(self) -> None:
        if self.num_targets < 1 or self.num_drafters < 1:
            raise ValueError(
                f"streamed mode needs at least one target and one drafter worker; got {self.num_targets} target "
                f"group(s) and {self.num_drafters} drafter(s) (world size = topology.target_workers + drafters)"
            )

    @classmethod
    def from_world(
        cls, world_size: int, target_workers: int, target_tp: int = 1, ranks_per_node: int = 0,
        drafter_groups: int = 1,
    ) -> "Topology":
        if target_tp < 1 or target_workers % target_tp:
            raise ValueError(
                f"topology.target_workers = {target_workers} target ranks do not form groups of topology.target_tp "
                f"= {target_tp}"
            )
        drafter_ranks = world_size - target_workers
        if drafter_ranks % drafter_groups:
            raise ValueError(
                f"{drafter_ranks} drafter ranks (world size {world_size} - topology.target_workers = {target_workers}) "
                f"do not split evenly into {drafter_groups} drafter groups"
            )
        return cls(target_workers // target_tp, drafter_ranks // drafter_groups, target_tp, ranks_per_node,
                   drafter_groups)

    @property
    def target_ranks(self) -> int:
        """Ranks holding the target: every rank of every group."""
        return self.num_targets * self.tp

    @property
    def world_size(self) -> int:
        return self.target_ranks + self.drafter_groups * self.num_drafters

    def role_of(self, rank: int) -> Role:
        return "target" if rank < self.target_ranks else "drafter"

    def group_of(self, rank: int) -> int:
        """The target group of target rank ``rank``."""
        return rank // self.tp

    def group_ranks(self, group: int) -> list[int]:
        return list(range(group * self.tp, (group + 1) * self.tp))

    def target_rank(self, group: int) -> int:
        """Global rank of the rank that sends group ``group``'s features (its first rank)."""
        return group * self.tp

    def drafter_rank(self, drafter: int, drafter_group: int = 0) -> int:
        """Global rank of drafter index ``drafter`` of drafter group ``drafter_group``."""
        return self.target_ranks + drafter_group * self.num_drafters + drafter

    def drafter_group_of(self, rank: int) -> int:
        """The drafter group of drafter rank ``rank``."""
        return (rank - self.target_ranks) // self.num_drafters

    def drafter_group_ranks(self, drafter_group: int) -> list[int]:
        return [self.drafter_rank(d, drafter_group) for d in range(self.num_drafters)]

    def describe(self, rank: int) -> str:
        """How failures name a peer: ``target worker 0 (rank 0)`` (groups of one), ``target group 1, TP rank 0
        (rank 2)``, ``drafter worker 1 (rank 3)``; on several nodes ``drafter worker 1 (rank 3, node 1)``."""
        where = f"rank {rank}"
        if 0 < self.ranks_per_node < self.world_size:
            where += f", node {rank // self.ranks_per_node}"
        if self.role_of(rank) == "drafter":
            index = (rank - self.target_ranks) % self.num_drafters
            if self.drafter_groups > 1:
                return f"drafter group {self.drafter_group_of(rank)}, drafter worker {index} ({where})"
            return f"drafter worker {index} ({where})"
        group = self.group_of(rank)
        if self.tp == 1:
            return f"target worker {group} ({where})"
        return f"target group {group}, TP rank {rank - self.target_rank(group)} ({where})"

    def describe_group(self, group: int) -> str:
        ranks = self.group_ranks(group)
        return f"target group {group} (ranks {ranks[0]}-{ranks[-1]})" if self.tp > 1 else self.describe(ranks[0])

    def routes(self) -> list[Route]:
        t_count, d_count = self.num_targets, self.num_drafters
        if t_count <= d_count:
            return [Route(d % t_count, d, 0, 1) for d in range(d_count)]
        routes = []
        for d in range(d_count):
            feeders = [t for t in range(t_count) if t % d_count == d]
            routes.extend(Route(t, d, k, len(feeders)) for k, t in enumerate(feeders))
        return routes

    def routes_from(self, target: int) -> list[Route]:
        return [r for r in self.routes() if r.target == target]

    def routes_to(self, drafter: int) -> list[Route]:
        return sorted((r for r in self.routes() if r.drafter == drafter), key=lambda r: r.offset)

    def feeder_of(self, drafter: int, step: int) -> int:
        """The target group that sends ``drafter`` its batches for optimizer step ``step``."""
        for route in self.routes_to(drafter):
            if route.carries(step):
                return route.target
        raise AssertionError(f"no route carries step {step} to drafter {drafter}")
