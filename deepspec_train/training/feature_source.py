"""Feature sources: what the trainer iterates to get packed micro-batches of target features.

A feature source (the ``FeatureSource`` protocol) yields, per optimizer step, the list of ``PackedBatch``
micro-batches this drafter rank trains on, and saves / restores its data position for checkpoints.
``InProcessFeatureSource`` is the colocated implementation: the process runs the frozen target itself; the
streamed one (``streaming.streamed_source``) receives the same batches from a target worker. The order of
sequences, the anchors and therefore every batch are a pure function of (seed, epoch, position), so a resumed
run sees exactly the batches an uninterrupted one would, and a streamed source that follows the same plan
produces the same features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Protocol, Sequence

import torch

from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.packing.packer import SequenceItem, pack_sequences
from deepspec_train.target.hidden_states import TargetTap


@dataclass
class StreamWindow:
    """What a streamed source measured since it was last asked: seconds spent waiting on the stream, wall
    seconds, and bytes received."""

    wait_seconds: float
    wall_seconds: float
    bytes_received: float


class FeatureSource(Protocol):
    """What the trainer iterates: per optimizer step, this drafter rank's micro-batches."""

    def __iter__(self) -> Iterator[list[PackedBatch]]: ...

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
class DataPosition:
    """Where a source is in its data: the resume point saved in checkpoints."""

    epoch: int = 0
    step_in_epoch: int = 0


class InProcessFeatureSource:
    """Colocated feature source over a tokenised dataset (columns ``input_ids``, ``loss_mask``, ``sample_id``).

    Each optimizer step consumes ``sequences_per_step`` sequences globally; this rank takes its strided share
    and runs the target over it ``micro_batch_sequences`` at a time.
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
        if sequences_per_step % world_size:
            raise ValueError(f"{sequences_per_step} sequences per step do not split over {world_size} drafter ranks")
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
            batches = self.batches_for(indices, self.position.epoch)
            self.position = DataPosition(self.position.epoch, self.position.step_in_epoch + 1)
            yield batches

    def batches_for(self, indices: list[int], epoch: int) -> list[PackedBatch]:
        batches: list[PackedBatch] = []
        for start in range(0, len(indices), self.micro_batch_sequences):
            rows = [self.dataset[i] for i in indices[start : start + self.micro_batch_sequences]]
            batches.extend(self._pack_rows(rows, epoch))
        return batches

    def _pack_rows(self, rows: list[dict], epoch: int) -> list[PackedBatch]:
        spec = self.packing
        ids = [torch.as_tensor(r["input_ids"], dtype=torch.long) for r in rows]
        masks = [torch.as_tensor(r["loss_mask"], dtype=torch.bool) for r in rows]
        states = run_target(self.tap, ids, self.device)
        items, anchors = [], []
        for row, seq_ids, mask, (ctx, final) in zip(rows, ids, masks, states):
            sample_id = int(row["sample_id"])
            items.append(SequenceItem(seq_ids, mask, ctx, final, sample_id))
            anchors.append(sample_anchors(mask, spec.num_anchors, anchor_generator(self.seed, epoch, sample_id)))
        packed = pack_sequences(
            items, anchors, spec.block_size, spec.token_budget, spec.mask_token_id, spec.label_convention
        )
        return [batch.to(self.device) for batch in packed]


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
