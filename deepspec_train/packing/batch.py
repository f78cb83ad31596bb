"""The packed micro-batch: the one structure that target features travel in.

A packed batch holds anchor blocks drawn from several sequences, plus the target context those blocks need.
Everything that the attention structure depends on is metadata (sequence id, position, block id), never
padding. The same dataclass is produced by the in-process feature source and by the streamed one, consumed by
every drafter, and split into tensors for the wire.

Shapes (``Nc`` context rows, ``Nb`` blocks, ``B`` block size, ``Ns`` supervised slots, ``K`` tapped target
layers, ``d`` target hidden size):

- ``ctx_features [Nc, K*d]``: target decoder-layer outputs at ``target_layer_ids``, concatenated per position.
- ``ctx_tokens [Nc]``: the token at each context position (EAGLE-3 pairs features at p with the token at p+1).
- ``ctx_seq [Nc]``, ``ctx_pos [Nc]``: packed-sequence index and position inside that sequence.
- ``block_input [Nb, B]``: ``[x_a, MASK, ..., MASK]``.
- ``block_seq [Nb]``, ``block_anchor [Nb]``: sequence index and anchor position ``a`` of each block.
- ``block_prev [Nb, B]``: the previous token for slot ``k``: ``x_{a+k}`` (teacher forcing for the Markov head).
- ``labels [Nb, B]``: ``x_{a+k+1}`` where supervised, ``IGNORE_INDEX`` where not. Supervised slots form a
  contiguous prefix of each block (labels past the end of the assistant span are dropped).
- ``target_hidden [Ns, d]``: the target's pre-LM-head (final-norm) state at position ``a+k`` for every
  supervised slot, in row-major order of ``labels != IGNORE_INDEX``.
- ``sample_ids [S]``: the dataset index of each packed sequence (for resume and debugging).

A block with anchor ``a`` sees context rows of its own sequence with ``ctx_pos < a`` and every slot of its own
block (bidirectional); its slot ``k`` sits at position ``a + k`` for rotary embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

IGNORE_INDEX = -100


@dataclass
class PackedBatch:
    ctx_features: torch.Tensor
    ctx_tokens: torch.Tensor
    ctx_seq: torch.Tensor
    ctx_pos: torch.Tensor
    block_input: torch.Tensor
    block_seq: torch.Tensor
    block_anchor: torch.Tensor
    block_prev: torch.Tensor
    labels: torch.Tensor
    target_hidden: torch.Tensor
    sample_ids: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return int(self.block_input.shape[0])

    @property
    def block_size(self) -> int:
        return int(self.block_input.shape[1])

    @property
    def supervised_mask(self) -> torch.Tensor:
        """Boolean ``[Nb, B]``: which slots carry a label."""
        return self.labels != IGNORE_INDEX

    @property
    def num_supervised(self) -> int:
        return int(self.supervised_mask.sum())

    def slot_positions(self) -> torch.Tensor:
        """Absolute position ``a + k`` of every block slot, ``[Nb, B]``."""
        offsets = torch.arange(self.block_size, device=self.block_anchor.device)
        return self.block_anchor[:, None] + offsets[None, :]

    def to(self, device: torch.device | str, float_dtype: torch.dtype | None = None) -> "PackedBatch":
        """Move every tensor to ``device``; floating tensors are cast to ``float_dtype`` when given."""
        moved = {}
        for f in fields(self):
            t = getattr(self, f.name)
            if float_dtype is not None and t.is_floating_point():
                t = t.to(device=device, dtype=float_dtype)
            else:
                t = t.to(device=device)
            moved[f.name] = t
        return PackedBatch(**moved)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Name -> tensor, in a fixed field order (the wire order)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
