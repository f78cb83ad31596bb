"""What a nominal packing puts on the wire: the ``PackedBatch`` bytes of ``num_sequences`` sequences of ``seq_len``
tokens, fully supervised, each with ``anchors`` anchors spread evenly over the valid range ``0 .. seq_len-2`` (so the
last anchor sits at the end, as it nearly always does with 512 anchors).

``payload_bytes`` is exact for the ``PackedBatch`` tensors the packer builds for that packing (the test checks it
against ``pack_sequences``): ``K*d`` feature values per context row, ``d`` per supervised slot, plus the int64
metadata. The per-message header and layout of the wire format (a few hundred bytes) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepspec_train.config.schema import DSPARK_LABELS, RecipeConfig
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.packing.anchor_counts import anchor_count
from deepspec_train.packing.packer import plan_micro_batches

INT64_BYTES = 8
# Fields of a PackedBatch with one int64 per context row / per block slot / per block / per sequence.
_INT_FIELDS_PER_CONTEXT_ROW = 3  # ctx_tokens, ctx_seq, ctx_pos
_INT_FIELDS_PER_SLOT = 3  # block_input, block_prev, labels
_INT_FIELDS_PER_BLOCK = 2  # block_seq, block_anchor
_INT_FIELDS_PER_SEQUENCE = 1  # sample_ids


def feature_bytes_per_value(cfg: RecipeConfig) -> int:
    """Bytes of one streamed feature value: the target's dtype (``auto`` = Qwen3's bf16 checkpoints)."""
    return 4 if cfg.target.dtype == "float32" else 2


def nominal_anchors(seq_len: int, anchors: int) -> list[int]:
    """``min(anchors, seq_len-1)`` anchors spread evenly over ``0 .. seq_len-2``, last one included."""
    if seq_len < 2:
        raise ValueError(f"a sequence needs at least 2 tokens to hold an anchor, got seq_len={seq_len}")
    count = min(anchors, seq_len - 1)
    if count == 1:
        return [0]
    last = seq_len - 2
    # Spacing last/(count-1) >= 1, so the floored positions are distinct.
    return [i * last // (count - 1) for i in range(count)]


def nominal_anchor_count(cfg: RecipeConfig, seq_len: int) -> int:
    """Anchors of a fully supervised nominal sequence of ``seq_len`` tokens under ``cfg``'s anchor rule."""
    return anchor_count(seq_len - 1, cfg.anchors.num_per_sequence, cfg.anchors.per_1k_tokens)


def supervised_slots(anchor: int, seq_len: int, block_size: int, labels: str = DSPARK_LABELS) -> int:
    """Supervised slots of the block at ``anchor`` in a fully supervised sequence: DSpark labels supervise slots
    ``0..B-1`` (slot k predicts ``x_{a+k+1}``), z-lab labels slots ``1..B-1``, each only up to the last token."""
    if labels == DSPARK_LABELS:
        return min(block_size, seq_len - 1 - anchor)
    return min(block_size - 1, seq_len - 1 - anchor)


@dataclass(frozen=True)
class PayloadBytes:
    """What the nominal packing puts in ``PackedBatch`` tensors (and so on the wire in streamed mode)."""

    micro_batches: int
    packed_sequences: int
    context_rows: int
    blocks: int
    supervised: int
    feature_bytes: int
    metadata_bytes: int
    # The largest single micro-batch: what one stream message carries.
    largest_micro_batch_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.feature_bytes + self.metadata_bytes

    @property
    def bytes_per_supervised_token(self) -> float:
        return self.total_bytes / max(self.supervised, 1)


def payload_bytes(
    cfg: RecipeConfig, geometry: DrafterGeometry, num_sequences: int, seq_len: int, anchors: int
) -> PayloadBytes:
    """Bytes of the packed micro-batches for ``num_sequences`` nominal sequences (see the module docstring).

    Packing follows the recipe: ``anchors.token_budget`` and ``train.micro_batch_sequences``; a sequence whose
    blocks exceed the budget is split into groups that each carry the context rows they need.
    """
    block = cfg.drafter.block_size
    anchor_list = nominal_anchors(seq_len, anchors)
    plan = plan_micro_batches(
        [torch.tensor(anchor_list, dtype=torch.long)] * num_sequences,
        block,
        cfg.anchors.token_budget,
        cfg.train.micro_batch_sequences,
    )
    value_bytes, taps, d = feature_bytes_per_value(cfg), len(cfg.target.layer_ids), geometry.hidden_size
    totals = [0] * 6
    largest = 0
    for micro_batch in plan:
        rows = sum(int(group.anchors.max()) for group in micro_batch)
        blocks = sum(int(group.anchors.numel()) for group in micro_batch)
        supervised = sum(
            supervised_slots(int(a), seq_len, block, cfg.drafter.labels) for group in micro_batch for a in group.anchors
        )
        feature = value_bytes * (rows * taps * d + supervised * d)
        metadata = INT64_BYTES * (
            _INT_FIELDS_PER_CONTEXT_ROW * rows + _INT_FIELDS_PER_SLOT * blocks * block
            + _INT_FIELDS_PER_BLOCK * blocks + _INT_FIELDS_PER_SEQUENCE * len(micro_batch)
        )
        for i, value in enumerate((len(micro_batch), rows, blocks, supervised, feature, metadata)):
            totals[i] += value
        largest = max(largest, feature + metadata)
    return PayloadBytes(len(plan), *totals, largest)


def stream_bytes_in_flight(cfg: RecipeConfig, geometry: DrafterGeometry, seq_len: int) -> int:
    """The most a target group's send queue holds with nominal sequences: ``stream.depth`` queued micro-batches
    plus the one being sent (the queue is bounded in micro-batches, ``streaming.target_worker``)."""
    payload = payload_bytes(cfg, geometry, cfg.train.micro_batch_sequences, seq_len, nominal_anchor_count(cfg, seq_len))
    return (cfg.stream.depth + 1) * payload.largest_micro_batch_bytes
