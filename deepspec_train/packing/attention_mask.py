"""Attention structure of a packed batch, built from its metadata alone.

Queries are the block slots in row-major order (query ``i`` is slot ``i % B`` of block ``i // B``). Keys are
the context rows followed by the block slots: ``[ctx rows (Nc); slots (Nb*B)]``, the layout in which the
drafter concatenates context and block keys/values. Query of block ``b`` may attend to

- context row ``j`` iff ``ctx_seq[j] == block_seq[b]`` and ``ctx_pos[j] < block_anchor[b]``;
- every slot of block ``b`` (bidirectional inside the block), and no other block.

``dense_mask`` materialises this as a boolean ``[Q, KV]`` for SDPA (CPU, tests, small batches);
``flex_block_mask`` gives the same rule as a flex_attention ``BlockMask`` whose sparse tiles are never
materialised densely (GPU memory). Building the BlockMask can itself be compiled (``compile=True``, GPU).
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from deepspec_train.packing.batch import PackedBatch


def num_keys(batch: PackedBatch) -> int:
    """Key/value length: context rows plus block slots."""
    return int(batch.ctx_seq.shape[0]) + batch.num_blocks * batch.block_size


def dense_mask(batch: PackedBatch) -> torch.Tensor:
    """Boolean ``[Nb*B, Nc + Nb*B]``: True where a query may attend to a key."""
    block_size = batch.block_size
    query_block = torch.arange(batch.num_blocks, device=batch.block_seq.device).repeat_interleave(block_size)
    query_seq = batch.block_seq[query_block]
    query_anchor = batch.block_anchor[query_block]
    sees_ctx = (batch.ctx_seq[None, :] == query_seq[:, None]) & (batch.ctx_pos[None, :] < query_anchor[:, None])
    sees_block = query_block[:, None] == query_block[None, :]
    return torch.cat([sees_ctx, sees_block], dim=1)


def flex_block_mask(batch: PackedBatch, compile: bool = False, tile_size: int = 128) -> BlockMask:
    """The rule of ``dense_mask`` as a flex_attention ``BlockMask`` (batch and head dimensions broadcast)."""
    device = batch.block_seq.device
    num_ctx = int(batch.ctx_seq.shape[0])
    block_size = batch.block_size
    # A sentinel context entry (sequence -1) at index Nc lets block keys index the context tables safely.
    sentinel = torch.full((1,), -1, dtype=batch.ctx_seq.dtype, device=device)
    ctx_seq = torch.cat([batch.ctx_seq, sentinel])
    ctx_pos = torch.cat([batch.ctx_pos, sentinel.to(batch.ctx_pos.dtype)])
    block_seq = batch.block_seq
    block_anchor = batch.block_anchor

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = q_idx // block_size
        ctx_row = torch.clamp(kv_idx, max=num_ctx)
        sees_ctx = (ctx_seq[ctx_row] == block_seq[q_block]) & (ctx_pos[ctx_row] < block_anchor[q_block])
        sees_block = (kv_idx >= num_ctx) & ((kv_idx - num_ctx) // block_size == q_block)
        return sees_ctx | sees_block

    return create_block_mask(
        mask_mod,
        B=None,
        H=None,
        Q_LEN=batch.num_blocks * block_size,
        KV_LEN=num_keys(batch),
        device=device,
        BLOCK_SIZE=tile_size,
        _compile=compile,
    )
