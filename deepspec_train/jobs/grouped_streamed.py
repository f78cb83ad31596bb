"""The streamed job of drafter groups (``jobs.drafter_groups`` with ``topology.target_workers = T > 0``): target
workers compute each sequence once for every group, and each group's drafter ranks train as a streamed run of
its recipe would.

The drafter ranks split evenly into the groups, in the order the groups are listed (``groups.json``): with ``N``
groups on ``W`` processes, group ``k`` is the ``D = (W - T) / N`` ranks ``T + k*D .. T + (k+1)*D - 1``, routed to
the target groups as a single streamed run of ``D`` drafters is (``streaming.roles``). A target group loads the
data and the target once, taps the union of the groups' layers through one ``target.shared_pass.SharedTargetPass``
and streams each drafter the micro-batches its group's recipe builds, cut to its layers
(``jobs.streamed.serve_drafter_groups``). A drafter rank runs ``jobs.streamed.run_drafter_role`` with its group's
config, run directory and process group (gradients, metrics and checkpoints never involve another group), so its
features, losses and weights are those of its recipe streamed alone with ``D`` drafter ranks.

A group with fewer steps stops receiving after its last step and its drafters finish (drafter files, W&B run)
while the others go on. On a preemption signal each group stops after its own step, checkpoints and tells the
target workers, which drop what they would still send it and leave once every group has stopped
(``training.preemption``). A user error on a drafter rank names its group and ends every rank
(``training.all_ranks_end``).
"""

from __future__ import annotations

from deepspec_train.jobs.drafter_groups import DrafterGroup, naming_errors
from deepspec_train.jobs.streamed import run_drafter_role, run_roles, serve_drafter_groups, streamed_topology
from deepspec_train.training.distributed import DistContext
from deepspec_train.training.trainer import TrainSummary


def run_streamed_groups(groups: list[DrafterGroup], world: DistContext) -> dict[str, TrainSummary]:
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
