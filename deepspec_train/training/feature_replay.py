"""Feature reuse on the drafter side: the micro-batches of the last target pass, kept so that the next
``train.feature_reuse - 1`` optimizer steps train on them again without a target forward.

Both feature sources (colocated and streamed) keep one pass in a ``PassReplay``: the steps of a pass are
``steps.plan.StepPlan.pass_of`` apart, so a source asks ``kept(pass)`` before it builds or receives anything.
Nothing of it is checkpointed: a run that resumes in the middle of a pass builds (or receives) that pass again,
and the target being frozen and deterministic, gets the same features, so resume stays exact.

The kept bytes are bounded by ``train.feature_reuse_bytes``: a pass that does not fit stops the run with one line
naming the setting, at the first pass, before its first update.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Iterable, Iterator, Optional

from deepspec_train.errors import UserError
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.training.feature_source import StepBatches


class ReplayBudgetError(UserError, ValueError):
    """A target pass whose features do not fit ``train.feature_reuse_bytes``."""


def batch_bytes(batch: PackedBatch) -> int:
    """The bytes of every tensor of ``batch``."""
    return sum(getattr(batch, f.name).nbytes for f in fields(batch))


class PassReplay:
    """One target pass's micro-batches (``StepBatches`` counts included), kept while its steps last."""

    def __init__(self, budget_bytes: int, reuse: int):
        self.budget_bytes = budget_bytes
        self.reuse = reuse
        self._pass: Optional[int] = None
        self._step: Optional[StepBatches] = None
        self.kept_bytes = 0

    def kept(self, pass_index: int) -> Optional[StepBatches]:
        """The kept step of ``pass_index`` as a fresh ``StepBatches`` (its batches iterable once more); None when
        another pass, or none, is kept."""
        if self._pass != pass_index or self._step is None:
            return None
        step = self._step
        return StepBatches(step.num_batches, step.num_active, step.num_supervised, list(step.batches),
                           step.slot_counts)

    def keep(self, pass_index: int, step: StepBatches) -> StepBatches:
        """Keep ``step`` (a pass's first use) and return it to train on. Its batches are kept as the trainer
        iterates them, so a streamed pass still arrives one micro-batch at a time; only one pass is kept."""
        self._pass, self.kept_bytes = pass_index, 0
        kept: list[PackedBatch] = []
        self._step = StepBatches(step.num_batches, step.num_active, step.num_supervised, kept, step.slot_counts)
        return StepBatches(step.num_batches, step.num_active, step.num_supervised,
                           self._keeping(step.batches, kept), step.slot_counts)

    def _keeping(self, batches: Iterable[PackedBatch], kept: list[PackedBatch]) -> Iterator[PackedBatch]:
        for batch in batches:
            self.kept_bytes += batch_bytes(batch)
            if self.kept_bytes > self.budget_bytes:
                raise ReplayBudgetError(
                    f"train.feature_reuse_bytes = {self.budget_bytes}: one target pass's features take more than "
                    f"that on this drafter rank ({self.kept_bytes} bytes after {len(kept) + 1} micro-batches) to be "
                    f"reused {self.reuse} times; raise it, or lower train.global_batch_sequences"
                )
            kept.append(batch)
            yield batch
