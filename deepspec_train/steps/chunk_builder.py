"""The chunk builder: runs the frozen target over a planned chunk and packs its micro-batches as planned.

The one place where sequences become ``PackedBatch`` inputs: the colocated source builds its own steps with it,
a target worker builds the steps of every drafter it feeds, so both modes produce the same tensors. The target
features are packed in ``FeatureDtypes`` (the run decides them: ``training.feature_dtypes``), so a streamed run
sends them in the dtype the drafter computes in, not wider.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Optional

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
    beyond marking the padding itself; a chunk of equal lengths has none, which the tap is told (no mask), so the
    target forward reads nothing back from the device to find it out.
    """
    lengths = [int(s.numel()) for s in sequences]
    longest = max(lengths)
    input_ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    attention = torch.zeros(len(sequences), longest, dtype=torch.long)
    for i, seq in enumerate(sequences):
        input_ids[i, : seq.numel()] = seq
        attention[i, : seq.numel()] = 1
    padded = min(lengths) < longest
    states = tap(input_ids.to(device), attention.to(device) if padded else None)
    return [
        (states.ctx_features[i, : seq.numel()], states.final_hidden[i, : seq.numel()])
        for i, seq in enumerate(sequences)
    ]


@dataclass(frozen=True)
class FeatureDtypes:
    """The dtypes a packed batch's target features are cast to when narrower than the target's (None: kept as
    the target produced them): ``ctx_features`` (the tapped layers) and ``target_hidden`` (final-norm states)."""

    ctx_features: Optional[torch.dtype] = None
    target_hidden: Optional[torch.dtype] = None

    def apply(self, batch: PackedBatch) -> PackedBatch:
        """``batch`` with each feature cast to its dtype where that has fewer bytes per value."""
        cast = {}
        for name in ("ctx_features", "target_hidden"):
            dtype, tensor = getattr(self, name), getattr(batch, name)
            if dtype is not None and torch.empty(0, dtype=dtype).element_size() < tensor.element_size():
                cast[name] = tensor.to(dtype)
        return dataclasses.replace(batch, **cast) if cast else batch


class ChunkBuilder:
    """Builds planned chunks with one tapped target on ``device``, features in ``feature_dtypes``."""

    def __init__(self, tap: TargetTap, packing: PackingSpec, device: torch.device | str,
                 feature_dtypes: FeatureDtypes = FeatureDtypes()):
        self.tap = tap
        self.packing = packing
        self.device = torch.device(device)
        self.feature_dtypes = feature_dtypes

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
            self.feature_dtypes.apply(
                build_packed_batch(items, groups, spec.block_size, spec.mask_token_id, spec.label_convention)
                .to(self.device)
            )
            for groups in chunk.groups
        ]

    def build_all(self, chunks: Iterable[ChunkPlan]) -> list[PackedBatch]:
        """Every micro-batch of ``chunks``, chunk after chunk."""
        return [batch for chunk in chunks for batch in self.build(chunk)]
