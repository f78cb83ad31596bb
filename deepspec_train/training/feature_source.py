"""Feature sources: what the trainer iterates to get packed micro-batches of target features.

A feature source (the ``FeatureSource`` protocol) yields, per optimizer step, the ``StepBatches`` this drafter
rank trains on (the step's counts, then its ``PackedBatch`` micro-batches, which a streamed source receives one
at a time while the trainer works through them), and saves / restores its data position for checkpoints.
``InProcessFeatureSource`` is the colocated implementation: the process runs the frozen target itself; the
streamed one (``streaming.streamed_source``) receives the same batches from a target worker. The order of
sequences, the anchors and therefore every batch are a pure function of (seed, epoch, position), so a resumed
run sees exactly the batches an uninterrupted one would, and a streamed source that follows the same plan
produces the same features.

A step's share of sequences is strided over the drafter ranks (rank ``r`` of ``D`` takes every ``D``-th sequence
from position ``r``), so ``D`` need not divide the sequences per step: shares then differ by one sequence, and the
trainer's loss is still normalised by the supervised slots of all ranks together.

Each share is run through the target ``micro_batch_sequences`` rows at a time (one *chunk*); a chunk's anchors
and packing depend only on token ids and loss masks, so ``chunk_plans`` knows every micro-batch's supervised
count before ``build_chunk`` runs the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Protocol, Sequence

import torch

from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.packing.packer import (
    BlockGroup, SequenceItem, build_packed_batch, plan_micro_batches, supervised_per_slot,
)
from deepspec_train.target.hidden_states import TargetTap


@dataclass
class StreamWindow:
    """What a streamed source measured since it was last asked: seconds spent waiting on the stream, wall
    seconds, bytes received, and per target group the peak bytes its send queue held so far (0 for a group that
    does not feed this drafter)."""

    wait_seconds: float
    wall_seconds: float
    bytes_received: float
    peak_bytes_in_flight: list[float]


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


def merge_slot_counts(parts: Iterable[dict[int, torch.Tensor]]) -> dict[int, torch.Tensor]:
    """Add per-slot count maps (a sequence split over several micro-batches or chunks sums its parts)."""
    merged: dict[int, torch.Tensor] = {}
    for part in parts:
        for sample_id, counts in part.items():
            merged[sample_id] = merged[sample_id] + counts if sample_id in merged else counts.clone()
    return merged


class FeatureSource(Protocol):
    """What the trainer iterates: per optimizer step, this drafter rank's micro-batches."""

    def __iter__(self) -> Iterator[StepBatches]: ...

    def state_dict(self) -> dict:
        """The data position to resume from (saved in checkpoints)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def pop_stream_metrics(self) -> Optional[StreamWindow]:
        """The stream's measurements since the last call; None for a source that does not stream."""
        ...


@dataclass
class PackingSpec:
    block_size: int
    num_anchors: int
    token_budget: int
    mask_token_id: int
    label_convention: str = "dspark"


def anchor_generator(seed: int, epoch: int, sample_id: int) -> torch.Generator:
    """A generator private to one (seed, epoch, sample): anchors do not depend on batching or rank."""
    gen = torch.Generator()
    gen.manual_seed((seed * 1_000_003 + epoch * 7_919 + sample_id) % (2**63 - 1))
    return gen


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(num_samples)
    gen = torch.Generator()
    gen.manual_seed(seed * 31 + epoch)
    return torch.randperm(num_samples, generator=gen)


@dataclass
class ChunkPlan:
    """One target forward's rows and the packed micro-batches they become (``groups``, one list of block groups
    per micro-batch, and their supervised slots), from token ids and loss masks alone."""

    rows: list[dict]
    anchors: list[torch.Tensor]
    groups: list[list[BlockGroup]]
    supervised: list[int]
    # Per sequence (dataset index) of the chunk, its supervised rows per block slot (``[block_size]`` int64).
    slot_counts: dict[int, torch.Tensor]


@dataclass
class DataPosition:
    """Where a source is in its data: the resume point saved in checkpoints."""

    epoch: int = 0
    step_in_epoch: int = 0


class InProcessFeatureSource:
    """Colocated feature source over a tokenised dataset (columns ``input_ids``, ``loss_mask``, ``sample_id``).

    Each optimizer step consumes ``sequences_per_step`` sequences globally; this rank takes its strided share
    (see the module docstring) and runs the target over it ``micro_batch_sequences`` at a time.
    """

    def __init__(
        self,
        dataset: Sequence[dict],
        tap: TargetTap,
        packing: PackingSpec,
        sequences_per_step: int,
        micro_batch_sequences: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str = "cpu",
        shuffle: bool = True,
    ):
        if len(dataset) < sequences_per_step:
            raise ValueError(f"dataset has {len(dataset)} sequences, fewer than one step's {sequences_per_step}")
        self.dataset = dataset
        self.tap = tap
        self.packing = packing
        self.sequences_per_step = sequences_per_step
        self.micro_batch_sequences = micro_batch_sequences
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.shuffle = shuffle
        self.position = DataPosition()

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.sequences_per_step

    def state_dict(self) -> dict:
        return {"epoch": self.position.epoch, "step_in_epoch": self.position.step_in_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.position = DataPosition(int(state["epoch"]), int(state["step_in_epoch"]))

    def pop_stream_metrics(self) -> None:
        """Features are computed in-process: there is no stream to measure."""
        return None

    def step_sample_indices(self, epoch: int, step_in_epoch: int) -> list[int]:
        """Dataset indices this rank trains on at (epoch, step)."""
        order = epoch_order(len(self.dataset), self.seed, epoch, self.shuffle)
        start = step_in_epoch * self.sequences_per_step
        chunk = order[start : start + self.sequences_per_step]
        return chunk[self.rank :: self.world_size].tolist()

    def __iter__(self) -> Iterator[list[PackedBatch]]:
        while True:
            if self.position.step_in_epoch >= self.steps_per_epoch:
                self.position = DataPosition(self.position.epoch + 1, 0)
            indices = self.step_sample_indices(self.position.epoch, self.position.step_in_epoch)
            plans = self.chunk_plans(indices, self.position.epoch)
            batches = self.build_chunks(plans)
            self.position = DataPosition(self.position.epoch, self.position.step_in_epoch + 1)
            yield StepBatches.of(batches, merge_slot_counts(chunk.slot_counts for chunk in plans))

    def batches_for(self, indices: list[int], epoch: int) -> list[PackedBatch]:
        return self.build_chunks(self.chunk_plans(indices, epoch))

    def build_chunks(self, plans: list[ChunkPlan]) -> list[PackedBatch]:
        return [batch for chunk in plans for batch in self.build_chunk(chunk)]

    def chunk_plans(self, indices: list[int], epoch: int) -> list[ChunkPlan]:
        """The chunks of ``indices`` with their anchors and packing; no target forward."""
        spec = self.packing
        plans = []
        for start in range(0, len(indices), self.micro_batch_sequences):
            rows = [self.dataset[i] for i in indices[start : start + self.micro_batch_sequences]]
            anchors = [
                sample_anchors(_loss_mask(row), spec.num_anchors, anchor_generator(self.seed, epoch, int(row["sample_id"])))
                for row in rows
            ]
            groups = plan_micro_batches(anchors, spec.block_size, spec.token_budget)
            supervised, slot_counts = [], {}
            for batch_groups in groups:
                total = 0
                for g in batch_groups:
                    per_slot = supervised_per_slot(_input_ids(rows[g.item]), _loss_mask(rows[g.item]), g.anchors,
                                                   spec.block_size, spec.label_convention)
                    total += int(per_slot.sum())
                    sample_id = int(rows[g.item]["sample_id"])
                    slot_counts[sample_id] = slot_counts.get(sample_id, 0) + per_slot
                supervised.append(total)
            plans.append(ChunkPlan(rows, anchors, groups, supervised, slot_counts))
        return plans

    def build_chunk(self, chunk: ChunkPlan) -> list[PackedBatch]:
        """Run the target over the chunk's rows and pack its micro-batches as planned."""
        spec = self.packing
        ids = [_input_ids(r) for r in chunk.rows]
        states = run_target(self.tap, ids, self.device)
        items = [
            SequenceItem(seq_ids, _loss_mask(row), ctx, final, int(row["sample_id"]))
            for row, seq_ids, (ctx, final) in zip(chunk.rows, ids, states)
        ]
        return [
            build_packed_batch(items, groups, spec.block_size, spec.mask_token_id, spec.label_convention).to(self.device)
            for groups in chunk.groups
        ]


def _input_ids(row: dict) -> torch.Tensor:
    return torch.as_tensor(row["input_ids"], dtype=torch.long)


def _loss_mask(row: dict) -> torch.Tensor:
    return torch.as_tensor(row["loss_mask"], dtype=torch.bool)


def run_target(
    tap: TargetTap, sequences: list[torch.Tensor], device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Target forward over right-padded sequences; per sequence (ctx_features [L, K*d], final_hidden [L, d]).

    Right padding leaves every real position's causal computation unchanged, so no attention mask is needed
    beyond marking the padding itself.
    """
    longest = max(int(s.numel()) for s in sequences)
    input_ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    attention = torch.zeros(len(sequences), longest, dtype=torch.long)
    for i, seq in enumerate(sequences):
        input_ids[i, : seq.numel()] = seq
        attention[i, : seq.numel()] = 1
    states = tap(input_ids.to(device), attention.to(device))
    return [(states.ctx_features[i, : seq.numel()], states.final_hidden[i, : seq.numel()]) for i, seq in enumerate(sequences)]


@dataclass
class ValidationShare:
    """The validation plan of one drafter rank: a fixed subset, fixed anchors, fixed order."""

    source: InProcessFeatureSource
    rows: list[int]

    def batches(self) -> list[PackedBatch]:
        return self.source.batches_for(self.rows, epoch=0)
