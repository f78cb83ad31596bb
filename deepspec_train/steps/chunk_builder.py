"""The chunk builder: runs the frozen target over a planned chunk and packs its micro-batches as planned.

The one place where sequences become ``PackedBatch`` inputs: the colocated source builds its own steps with it,
a target worker builds the steps of every drafter it feeds, so both modes produce the same tensors.
"""

from __future__ import annotations

from typing import Iterable

import torch

from deepspec_train.packing.batch import PackedBatch
from deepspec_train.packing.packer import SequenceItem, build_packed_batch
from deepspec_train.steps.chunk_plan import ChunkPlan, PackingSpec, input_ids_of, loss_mask_of
from deepspec_train.target.hidden_states import TargetTap


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
    return [
        (states.ctx_features[i, : seq.numel()], states.final_hidden[i, : seq.numel()])
        for i, seq in enumerate(sequences)
    ]


class ChunkBuilder:
    """Builds planned chunks with one tapped target on ``device``."""

    def __init__(self, tap: TargetTap, packing: PackingSpec, device: torch.device | str):
        self.tap = tap
        self.packing = packing
        self.device = torch.device(device)

    def build(self, chunk: ChunkPlan) -> list[PackedBatch]:
        """Run the target over the chunk's rows and pack its micro-batches as planned."""
        spec = self.packing
        ids = [input_ids_of(row) for row in chunk.rows]
        states = run_target(self.tap, ids, self.device)
        items = [
            SequenceItem(seq_ids, loss_mask_of(row), ctx, final, int(row["sample_id"]))
            for row, seq_ids, (ctx, final) in zip(chunk.rows, ids, states)
        ]
        return [
            build_packed_batch(items, groups, spec.block_size, spec.mask_token_id, spec.label_convention)
            .to(self.device)
            for groups in chunk.groups
        ]

    def build_all(self, chunks: Iterable[ChunkPlan]) -> list[PackedBatch]:
        """Every micro-batch of ``chunks``, chunk after chunk."""
        return [batch for chunk in chunks for batch in self.build(chunk)]
