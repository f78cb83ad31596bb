"""Activation checkpointing of the drafters (``drafter.activation_checkpointing``): trade a recomputed forward for
the activations a long context would otherwise keep until backward.

Two pieces, both ``torch.utils.checkpoint`` with ``use_reentrant=False`` (autocast state and nested tensors are
handled, and gradients reach parameters the inputs do not carry):

- ``checkpointed``: one call whose saved tensors are dropped and recomputed in backward; what stays alive is only
  the call's own arguments (a DSpark / DFlash backbone layer: its input stream, plus the context states, rotary
  tables and mask that every layer shares; an EAGLE-3 TTT step: its hidden input and the keys / values before it).
- ``row_chunked``: the context projection (``fc`` over the concatenated taps, ``K*d -> d``) over every context
  row. Without checkpointing ``fc`` saves its ``[Nc, K*d]`` input in the weights' dtype, a second copy of the
  features the batch already holds (fp32: twice their bf16 bytes; 2.7 GB at 32K rows of Qwen3-8B's five taps).
  Checkpointed in row chunks it saves nothing but the batch's own features, and the recompute in backward
  materialises one chunk of ``CONTEXT_CHUNK_ROWS`` rows at a time, not all of them.

Off (the default) or without gradients (validation, decoding) both are the plain call: outputs are the same
either way (tested to float tolerance: chunking reorders the weight gradient's sum over rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

# Context rows per checkpointed chunk of the context projection: 4,096 rows of Qwen3-8B's 5 x 4,096-wide taps are
# 0.34 GB in fp32 while they are recomputed, and a chunk is still a large enough matmul to run at full speed.
CONTEXT_CHUNK_ROWS = 4096


def _recomputes() -> bool:
    return torch.is_grad_enabled()


def checkpointed(fn: Callable[..., Any], *args: Any, enabled: bool) -> Any:
    """``fn(*args)``, its activations recomputed in backward when ``enabled`` and gradients are being recorded."""
    if enabled and _recomputes():
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def row_chunked(
    fn: Callable[..., tuple[torch.Tensor, ...]],
    rows: Sequence[torch.Tensor],
    out_dim: int,
    enabled: bool,
) -> tuple[torch.Tensor, ...]:
    """``fn(*rows)`` (a tuple of outputs), each of ``rows`` cut into chunks of ``CONTEXT_CHUNK_ROWS`` along dim 0
    and every chunk checkpointed; the chunks' outputs are concatenated along ``out_dim``. ``fn`` must treat rows
    independently. Off or without gradients: one plain call on all rows."""
    chunk_rows = CONTEXT_CHUNK_ROWS
    if not (enabled and _recomputes()) or rows[0].shape[0] <= chunk_rows:
        return checkpointed(fn, *rows, enabled=enabled)
    pieces = [
        checkpoint(fn, *(r[start : start + chunk_rows] for r in rows), use_reentrant=False)
        for start in range(0, rows[0].shape[0], chunk_rows)
    ]
    return tuple(torch.cat(parts, dim=out_dim) for parts in zip(*pieces))
