"""Attention structure of a packed batch, built from its metadata alone.

Queries are the block slots in row-major order (query ``i`` is slot ``i % B`` of block ``i // B``). Keys are
the context rows followed by the block slots: ``[ctx rows (Nc); slots (Nb*B)]``, the layout in which the
drafter concatenates context and block keys/values. Query of block ``b`` may attend to

- context row ``j`` iff ``ctx_seq[j] == block_seq[b]`` and ``ctx_pos[j] < block_anchor[b]``;
- every slot of block ``b`` (bidirectional inside the block), and no other block.

``dense_mask`` materialises this as a boolean ``[Q, KV]`` for SDPA (CPU, tests, small batches);
``flex_block_mask`` gives the same rule as a flex_attention ``BlockMask`` built from the metadata tile by tile,
never through a ``[Q, KV]`` tensor (``create_block_mask`` evaluates its mask_mod over every pair: at 32K tokens
with 4,096 anchors that is 28,672 x 61,438 pairs, 1.8 GB as booleans and several times that in its gathers).

The construction rests on the order ``build_packed_batch`` gives a packed batch, which it checks: context rows
sorted by (sequence, position) and blocks by (sequence, anchor). Then what a block ``b`` sees is two key
intervals, ``[lo_b, hi_b)`` (the context rows of its sequence before its anchor, found by binary search) and its
own ``B`` slots, and a ``T x T`` tile (query tile ``i``, key tile ``j``) is

- visited iff some block of query tile ``i`` has an interval meeting key tile ``j``;
- full iff both tiles lie wholly inside ``[0, Q)`` x ``[0, KV)`` and every block of query tile ``i`` covers key
  tile ``j`` wholly (with one interval, or both when they are adjacent);
- partial (the mask_mod runs inside it) iff visited and not full.

Marking key-tile ranges per (block, query tile) pair with difference arrays makes the cost O(tiles + blocks) in
time and memory; the partial and full tiles are then exactly those ``create_block_mask`` finds (tested).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask

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


def packed_mask_mod(batch: PackedBatch) -> Callable:
    """The rule of ``dense_mask`` as a flex_attention mask_mod over (query, key) indices (run inside partial tiles
    only; indices past the ends, which the kernel may pass in a last partial tile, are clamped, then masked by it)."""
    device = batch.block_seq.device
    num_ctx = int(batch.ctx_seq.shape[0])
    block_size = batch.block_size
    last_block = batch.num_blocks - 1
    # A sentinel context entry (sequence -1) at index Nc lets block keys index the context tables safely.
    sentinel = torch.full((1,), -1, dtype=batch.ctx_seq.dtype, device=device)
    ctx_seq = torch.cat([batch.ctx_seq, sentinel])
    ctx_pos = torch.cat([batch.ctx_pos, sentinel.to(batch.ctx_pos.dtype)])
    block_seq = batch.block_seq
    block_anchor = batch.block_anchor

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = torch.clamp(q_idx // block_size, max=last_block)
        ctx_row = torch.clamp(kv_idx, max=num_ctx)
        sees_ctx = (ctx_seq[ctx_row] == block_seq[q_block]) & (ctx_pos[ctx_row] < block_anchor[q_block])
        sees_block = (kv_idx >= num_ctx) & ((kv_idx - num_ctx) // block_size == q_block)
        return sees_ctx | sees_block

    return mask_mod


def check_packed_order(batch: PackedBatch) -> None:
    """Raise unless context rows are sorted by (sequence, position) and blocks by (sequence, anchor), strictly:
    the order ``flex_block_mask`` relies on (``build_packed_batch``'s)."""
    for what, seq, pos in (("context rows", batch.ctx_seq, batch.ctx_pos),
                           ("blocks", batch.block_seq, batch.block_anchor)):
        if seq.numel() < 2:
            continue
        increasing = (seq[1:] > seq[:-1]) | ((seq[1:] == seq[:-1]) & (pos[1:] > pos[:-1]))
        if not bool(increasing.all()):
            raise ValueError(f"packed batch {what} are not sorted by (sequence, position): flex_block_mask needs it")


def _context_intervals(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block, the context rows it sees as ``[lo, hi)`` (``lo == hi``: none), by binary search on the sorted
    (sequence, position) keys."""
    ctx_seq, ctx_pos = batch.ctx_seq.long(), batch.ctx_pos.long()
    block_seq, block_anchor = batch.block_seq.long(), batch.block_anchor.long()
    if ctx_seq.numel() == 0:
        zeros = torch.zeros_like(block_seq)
        return zeros, zeros
    # One int64 key per (sequence, position): positions and anchors lie in [0, stride).
    stride = int(torch.maximum(ctx_pos.max(), block_anchor.max())) + 1
    keys = ctx_seq * stride + ctx_pos
    lo = torch.searchsorted(keys, block_seq * stride)
    hi = torch.searchsorted(keys, block_seq * stride + block_anchor)
    return lo, hi


def _mark(counts: torch.Tensor, rows: torch.Tensor, first: torch.Tensor, last: torch.Tensor) -> None:
    """Add 1 to ``counts[row, first..last]`` for every (row, first, last) with ``first <= last`` (a difference
    array: ``counts`` has one spare column and is summed along its rows afterwards)."""
    keep = first <= last
    rows, first, last = rows[keep], first[keep], last[keep]
    ones = torch.ones_like(rows)
    counts.index_put_((rows, first), ones, accumulate=True)
    counts.index_put_((rows, last + 1), -ones, accumulate=True)


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``[n_q, n_kv]`` tile table as BlockMask's (counts ``[1, 1, n_q]``, indices ``[1, 1, n_q, n_kv]``): marked
    tiles first in ascending order, the order ``create_block_mask`` gives."""
    tiles = tiles.to(torch.int32)
    indices = torch.argsort(tiles, dim=-1, descending=True, stable=True).to(torch.int32)
    return tiles.sum(-1, dtype=torch.int32)[None, None], indices[None, None].contiguous()


def flex_block_mask(batch: PackedBatch, tile_size: int = 128) -> BlockMask:
    """The rule of ``dense_mask`` as a flex_attention ``BlockMask`` (batch and head dimensions broadcast), built
    from the batch's metadata in O(tiles) memory (see the module docstring)."""
    check_packed_order(batch)
    device = batch.block_seq.device
    block_size, num_blocks, tile = batch.block_size, batch.num_blocks, tile_size
    num_ctx = int(batch.ctx_seq.shape[0])
    q_len, kv_len = num_blocks * block_size, num_keys(batch)
    q_tiles, kv_tiles = -(-q_len // tile), -(-kv_len // tile)

    # Every (block, query tile) pair: a block's slots may straddle query tiles.
    blocks = torch.arange(num_blocks, device=device)
    first_tile = blocks * block_size // tile
    spans = ((blocks + 1) * block_size - 1) // tile - first_tile + 1
    pair_block = torch.repeat_interleave(blocks, spans)
    pair_tile = first_tile[pair_block] + torch.arange(pair_block.numel(), device=device) - torch.repeat_interleave(
        torch.cumsum(spans, 0) - spans, spans
    )
    lo, hi = _context_intervals(batch)
    lo, hi = lo[pair_block], hi[pair_block]
    slots_lo = num_ctx + pair_block * block_size
    slots_hi = slots_lo + block_size

    # Visited: key tiles meeting either interval of some block of the query tile.
    visited = torch.zeros(q_tiles, kv_tiles + 1, dtype=torch.long, device=device)
    _mark(visited, pair_tile, lo // tile, torch.where(hi > lo, (hi - 1) // tile, lo // tile - 1))
    _mark(visited, pair_tile, slots_lo // tile, (slots_hi - 1) // tile)
    visited = visited.cumsum(1)[:, :kv_tiles] > 0

    # Full: key tiles wholly inside the context interval or the slots of every block of the query tile (the two
    # intervals count as one when adjacent: a block at the batch's first slots seeing the last context rows).
    adjacent = (hi == slots_lo) & (hi > lo)
    ctx_end = torch.where(adjacent, slots_hi, hi)
    covers = torch.zeros(q_tiles, kv_tiles + 1, dtype=torch.long, device=device)
    _mark(covers, pair_tile, -(-lo // tile), ctx_end // tile - 1)
    slots_first = -(-slots_lo // tile)
    _mark(covers, pair_tile, slots_first, torch.where(adjacent, slots_first - 1, slots_hi // tile - 1))
    blocks_per_tile = torch.bincount(pair_tile, minlength=q_tiles)
    full = covers.cumsum(1)[:, :kv_tiles] == blocks_per_tile[:, None]
    whole_q = (torch.arange(q_tiles, device=device) + 1) * tile <= q_len
    whole_kv = (torch.arange(kv_tiles, device=device) + 1) * tile <= kv_len
    full &= whole_q[:, None] & whole_kv[None, :] & visited

    kv_num, kv_indices = _ordered(visited & ~full)
    full_num, full_indices = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_indices, full_num, full_indices, BLOCK_SIZE=tile, mask_mod=packed_mask_mod(batch),
        seq_lengths=(q_len, kv_len),
    )
