"""Role assignment: every drafter step has exactly one feeding target, and every target feeds someone."""

from __future__ import annotations

import pytest

from deepspec_train.streaming.roles import Topology


@pytest.mark.parametrize("targets,drafters", [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (2, 5), (5, 2), (8, 8), (4, 12)])
def test_routes_cover_every_step_once(targets: int, drafters: int) -> None:
    topo = Topology(targets, drafters)
    routes = topo.routes()
    assert {r.target for r in routes} == set(range(targets))
    for drafter in range(drafters):
        for step in range(24):
            feeders = [r.target for r in routes if r.drafter == drafter and r.carries(step)]
            assert feeders == [topo.feeder_of(drafter, step)]


def test_roles_and_names() -> None:
    topo = Topology.from_world(world_size=5, target_workers=2)
    assert [topo.role_of(r) for r in range(5)] == ["target", "target", "drafter", "drafter", "drafter"]
    assert topo.drafter_rank(1) == 3
    assert topo.describe(1) == "target worker 1 (rank 1)"
    assert topo.describe(4) == "drafter worker 2 (rank 4)"


def test_two_targets_take_turns_for_one_drafter() -> None:
    topo = Topology(2, 1)
    assert [topo.feeder_of(0, s) for s in range(4)] == [0, 1, 0, 1]


@pytest.mark.parametrize("targets,world", [(0, 2), (2, 2), (3, 2)])
def test_streamed_mode_needs_both_roles(targets: int, world: int) -> None:
    with pytest.raises(ValueError, match="at least one target and one drafter"):
        Topology.from_world(world, targets)


def test_target_groups_route_like_single_targets() -> None:
    """Groups of 2 ranks: group g is ranks 2g, 2g+1, sends from 2g, and routes as target g would."""
    topo = Topology.from_world(world_size=7, target_workers=4, target_tp=2)
    assert (topo.num_targets, topo.num_drafters, topo.target_ranks) == (2, 3, 4)
    assert [topo.role_of(r) for r in range(7)] == ["target"] * 4 + ["drafter"] * 3
    assert [topo.group_of(r) for r in range(4)] == [0, 0, 1, 1] and topo.group_ranks(1) == [2, 3]
    assert topo.target_rank(1) == 2 and topo.drafter_rank(0) == 4
    assert topo.routes() == Topology(2, 3).routes()
    assert topo.describe(3) == "target group 1, TP rank 1 (rank 3)"
    assert topo.describe(4) == "drafter worker 0 (rank 4)"
    assert topo.describe_group(0) == "target group 0 (ranks 0-1)"


def test_target_ranks_must_form_whole_groups() -> None:
    with pytest.raises(ValueError, match="do not form groups of topology.target_tp = 2"):
        Topology.from_world(5, 3, 2)
