"""The step plan: which sequences every optimizer step of one drafter rank trains on, as a pure function of the
step number (no process group, no model).

Global step ``s`` is step ``s % steps_per_epoch`` of epoch ``s // steps_per_epoch``; an epoch visits a
permutation of the dataset drawn from (seed, epoch) (``order_seed`` in place of the seed when set:
``run.data_seed``), ``sequences_per_step`` sequences per step, and the sequences that do not fill a whole step
are left out of that epoch. A step's sequences are strided over the drafter ranks
(rank ``r`` of ``D`` takes every ``D``-th sequence from position ``r``), so ``D`` need not divide the sequences
per step: shares then differ by one sequence, and the trainer's loss is still normalised by the supervised slots
of all ranks together.

Feature reuse (``train.feature_reuse`` R): each target pass feeds R consecutive optimizer steps. Step ``s`` then
trains on pass ``s // R`` (its sequences, anchors and packing are those step ``s // R`` has without reuse), so an
epoch is R times as many steps and a source builds a pass only at its first step (``starts_pass``) or at the step a
run resumes from; R = 1 is the plan without reuse, step for step.

A checkpoint stores the data position after its last step as (epoch, step in epoch) with a lazy epoch rollover:
after the last step of epoch ``e`` it reads (e, steps_per_epoch), not (e + 1, 0). ``data_state`` and
``next_step_of`` convert between that record and the next global step, for the colocated and streamed sources
alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from deepspec_train.steps.chunk_plan import ChunkPlan, PackingSpec, plan_chunks


@dataclass(frozen=True)
class StepPosition:
    """Where a global step falls in the data."""

    epoch: int
    step_in_epoch: int


def step_position(step: int, steps_per_epoch: int) -> StepPosition:
    return StepPosition(*divmod(step, steps_per_epoch))


def data_state(next_step: int, steps_per_epoch: int) -> dict:
    """The checkpoint's data position once steps ``0 .. next_step-1`` are done (lazy rollover, see above)."""
    if next_step == 0:
        return {"epoch": 0, "step_in_epoch": 0}
    last = step_position(next_step - 1, steps_per_epoch)
    return {"epoch": last.epoch, "step_in_epoch": last.step_in_epoch + 1}


def next_step_of(state: dict, steps_per_epoch: int) -> int:
    """The global step a checkpoint's data position resumes at."""
    return int(state["epoch"]) * steps_per_epoch + int(state["step_in_epoch"])


def epoch_order(num_sequences: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The dataset indices of one epoch, in visiting order."""
    if not shuffle:
        return torch.arange(num_sequences)
    gen = torch.Generator()
    gen.manual_seed(seed * 31 + epoch)
    return torch.randperm(num_sequences, generator=gen)


@dataclass(frozen=True, eq=False)
class StepPlan:
    """One drafter rank's plan over ``rows`` (a tokenised dataset: ``input_ids``, ``loss_mask``, ``sample_id``):
    per global step, its position, this rank's sequence indices and their chunk plans."""

    rows: Sequence[dict]
    sequences_per_step: int
    seed: int
    packing: PackingSpec
    rank: int = 0
    world_size: int = 1
    shuffle: bool = True
    # The epoch order's own seed (None: ``seed``, which always draws the anchors).
    order_seed: Optional[int] = None
    # Optimizer steps per target pass (``train.feature_reuse``).
    reuse: int = 1

    def __post_init__(self) -> None:
        if len(self.rows) < self.sequences_per_step:
            raise ValueError(f"dataset has {len(self.rows)} sequences, fewer than one step's {self.sequences_per_step}")
        if self.reuse < 1:
            raise ValueError(f"reuse = {self.reuse}: each target pass feeds at least one step")

    @property
    def passes_per_epoch(self) -> int:
        return len(self.rows) // self.sequences_per_step

    @property
    def steps_per_epoch(self) -> int:
        return self.passes_per_epoch * self.reuse

    def pass_of(self, step: int) -> int:
        """The target pass whose features global ``step`` trains on."""
        return step // self.reuse

    def starts_pass(self, step: int) -> bool:
        """Whether ``step`` is the first of its pass's steps (the one that runs the target)."""
        return step % self.reuse == 0

    def position(self, step: int) -> StepPosition:
        """Where the pass of global ``step`` falls in the data."""
        return step_position(self.pass_of(step), self.passes_per_epoch)

    def sequence_indices(self, step: int) -> list[int]:
        """Dataset indices this rank trains on at global ``step``."""
        where = self.position(step)
        order_seed = self.seed if self.order_seed is None else self.order_seed
        order = epoch_order(len(self.rows), order_seed, where.epoch, self.shuffle)
        start = where.step_in_epoch * self.sequences_per_step
        return order[start : start + self.sequences_per_step][self.rank :: self.world_size].tolist()

    def chunks(self, step: int) -> list[ChunkPlan]:
        """This rank's chunks at global ``step``: rows, anchors and packing, no target forward."""
        rows = [self.rows[i] for i in self.sequence_indices(step)]
        return plan_chunks(rows, self.packing, self.seed, self.position(step).epoch)
