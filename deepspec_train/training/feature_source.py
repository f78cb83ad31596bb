"""Feature sources: what the trainer iterates to get packed micro-batches of target features.

A feature source (the ``FeatureSource`` protocol) yields, per optimizer step, the ``StepBatches`` this drafter
rank trains on (the step's counts, then its ``PackedBatch`` micro-batches, which a streamed source receives one
at a time while the trainer works through them), saves / restores its data position for checkpoints and reports
its own measurements as a metrics dict. ``InProcessFeatureSource`` is the colocated implementation: the process
runs the frozen target itself; the streamed one (``streaming.streamed_source``) receives the same batches from a
target worker. Both follow the same ``steps.plan.StepPlan``, so a resumed run sees exactly the batches an
uninterrupted one would, and streamed features are the colocated ones.

Feature reuse (``train.feature_reuse`` R > 1): both sources keep the last target pass's micro-batches in a
``PassReplay`` so that the pass's next R - 1 optimizer steps train on them again without a target forward (the
steps of a pass are ``steps.plan.StepPlan.pass_of`` apart). Nothing of it is checkpointed: a run that resumes in
the middle of a pass builds (or receives) that pass again and, the target being frozen and deterministic, gets the
same features, so resume stays exact. The kept bytes are bounded by ``train.feature_reuse_bytes``: a pass that does
not fit stops the run with one line naming the setting, at the first pass, before its first update.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Iterable, Iterator, Optional, Protocol

import torch

from deepspec_train.common.errors import UserError
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.steps.chunk_builder import ChunkBuilder
from deepspec_train.steps.chunk_plan import chunks_slot_counts, merge_slot_counts
from deepspec_train.steps.plan import StepPlan, data_state, next_step_of


@dataclass
class StepBatches:
    """One optimizer step of one drafter rank: the counts the trainer needs before its first backward (the
    normaliser and, for DeepSpeed, the backward count), then the micro-batches, to be iterated exactly once."""

    num_batches: int
    # Micro-batches with at least one supervised slot (the others are skipped).
    num_active: int
    num_supervised: int
    batches: Iterable[PackedBatch]
    # Per sequence (dataset index) of the step, its supervised rows per block slot over all the step's
    # micro-batches (``[block_size]`` int64): what a per-sequence loss normaliser needs before the first backward.
    slot_counts: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, batches: list[PackedBatch], slot_counts: Optional[dict[int, torch.Tensor]] = None) -> "StepBatches":
        """A step of ``batches``; ``slot_counts`` from the packing plan when the caller has them, else counted
        from the batches themselves."""
        supervised = [b.num_supervised for b in batches]
        if slot_counts is None:
            slot_counts = merge_slot_counts(batch_slot_counts(b) for b in batches)
        return cls(len(batches), sum(1 for n in supervised if n > 0), sum(supervised), batches, slot_counts)


def batch_slot_counts(batch: PackedBatch) -> dict[int, torch.Tensor]:
    """Per sequence (dataset index) of ``batch``, its supervised rows per block slot."""
    counts: dict[int, torch.Tensor] = {}
    sequence_of_block = batch.sample_ids[batch.block_seq].cpu()
    per_block = batch.supervised_mask.cpu().long()
    for sample_id in torch.unique(sequence_of_block).tolist():
        counts[sample_id] = per_block[sequence_of_block == sample_id].sum(0)
    return counts


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


class FeatureSource(Protocol):
    """What the trainer iterates: per optimizer step, this drafter rank's micro-batches."""

    def __iter__(self) -> Iterator[StepBatches]: ...

    def state_dict(self) -> dict:
        """The data position to resume from (saved in checkpoints)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def pop_metrics(self) -> dict[str, float]:
        """The source's own measurements since the last call, ready to log (empty when it measures nothing).
        Every drafter rank calls it at the same steps, so a source may reduce its numbers over the ranks."""
        ...


class InProcessFeatureSource:
    """Colocated feature source: follows ``plan`` step after step and builds each step's chunks with the
    in-process target (``builder``); with ``replay`` (``train.feature_reuse`` > 1), a pass's later steps train on
    the micro-batches its first step built."""

    def __init__(self, plan: StepPlan, builder: ChunkBuilder, replay: Optional["PassReplay"] = None):
        self.plan = plan
        self.builder = builder
        self.replay = replay
        self.next_step = 0

    def state_dict(self) -> dict:
        return data_state(self.next_step, self.plan.steps_per_epoch)

    def load_state_dict(self, state: dict) -> None:
        self.next_step = next_step_of(state, self.plan.steps_per_epoch)

    def pop_metrics(self) -> dict[str, float]:
        """Features are computed in-process: nothing of the source's own to report."""
        return {}

    def __iter__(self) -> Iterator[StepBatches]:
        while True:
            step = self.next_step
            self.next_step += 1
            if self.replay is None:
                yield self._build(step)
                continue
            pass_index = self.plan.pass_of(step)
            kept = self.replay.kept(pass_index)
            yield kept if kept is not None else self.replay.keep(pass_index, self._build(step))

    def _build(self, step: int) -> StepBatches:
        chunks = self.plan.chunks(step)
        return StepBatches.of(self.builder.build_all(chunks), chunks_slot_counts(chunks))
