"""Which rank does what in streamed mode, and which target worker feeds which drafter worker at which step.

Ranks ``0 .. T-1`` are target workers, ranks ``T .. W-1`` drafter workers (drafter index ``i`` is global rank
``T + i``). Every drafter is fed by one or more targets and every target feeds at least one drafter:

- ``T <= D``: drafter ``i`` is fed by target ``i % T`` at every step (a target serves ``ceil(D / T)`` drafters).
- ``T > D``: drafter ``i`` is fed by the targets ``t`` with ``t % D == i``, taking turns step by step (step ``s``
  comes from the ``s % n``-th of its ``n`` targets), so extra target workers add forward throughput.

The assignment is a pure function of (T, D): both sides derive it without exchanging anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["target", "drafter"]


@dataclass(frozen=True)
class Route:
    """Target ``target`` sends drafter ``drafter`` the steps ``s`` with ``s % stride == offset``."""

    target: int
    drafter: int
    offset: int
    stride: int

    def carries(self, step: int) -> bool:
        return step % self.stride == self.offset


@dataclass(frozen=True)
class Topology:
    num_targets: int
    num_drafters: int

    def __post_init__(self) -> None:
        if self.num_targets < 1 or self.num_drafters < 1:
            raise ValueError(
                f"streamed mode needs at least one target and one drafter worker; got {self.num_targets} target(s) "
                f"and {self.num_drafters} drafter(s) (world size = topology.target_workers + drafters)"
            )

    @classmethod
    def from_world(cls, world_size: int, target_workers: int) -> "Topology":
        return cls(target_workers, world_size - target_workers)

    @property
    def world_size(self) -> int:
        return self.num_targets + self.num_drafters

    def role_of(self, rank: int) -> Role:
        return "target" if rank < self.num_targets else "drafter"

    def drafter_rank(self, drafter: int) -> int:
        """Global rank of drafter index ``drafter``."""
        return self.num_targets + drafter

    def describe(self, rank: int) -> str:
        """``target worker 0 (rank 0)`` / ``drafter worker 1 (rank 3)``: how failures name a peer."""
        if self.role_of(rank) == "target":
            return f"target worker {rank} (rank {rank})"
        return f"drafter worker {rank - self.num_targets} (rank {rank})"

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
        """The target worker (= its global rank) that sends ``drafter`` its batches for optimizer step ``step``."""
        for route in self.routes_to(drafter):
            if route.carries(step):
                return route.target
        raise AssertionError(f"no route carries step {step} to drafter {drafter}")
