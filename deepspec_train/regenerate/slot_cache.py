"""The key/value cache of continuous batching: rows join and leave a decoding batch between steps.

Every layer's keys and values live in one preallocated buffer ``[slots, kv_heads, capacity, head_dim]``. All rows
write their next token into the same column, so a decoding step writes one column instead of copying the whole
cache (``DynamicCache`` concatenates at every step). Row ``r`` holds its tokens in the columns ``[start_r, width)``:
a row that joins is placed so that it ends at ``width`` (its left is padding, masked out), a row that leaves is
replaced by the last row, so the rows in flight are always the buffer's first ``rows`` slots and a step computes
nothing for finished rows. When the columns run out, the buffer is rebuilt without the leading columns no row uses
any more (and larger when it must be), so its width stays near the longest row in flight.

``transformers`` runs its attention layers against it through the ``Cache`` interface; positions and the padding
mask come from ``positions`` and ``step_mask``.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

# Columns added beyond what the rows in flight need when the buffer is rebuilt, so rebuilds stay rare.
_MIN_SPARE_COLUMNS = 64


class _SlotLayer(CacheLayerMixin):
    """One layer's view of the shared buffer: ``update`` writes the step's column and returns the rows' keys."""

    is_sliding = False

    def __init__(self, cache: SlotCache, layer: int) -> None:
        super().__init__()
        self.cache = cache
        self.layer = layer
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise AssertionError("the slot cache is filled from prefill caches, never lazily")

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.write_step(self.layer, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.width + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache.width

    def get_max_length(self) -> int:
        return -1


class SlotCache(Cache):
    """Keys and values of up to ``slots`` rows decoding together (see the module docstring)."""

    def __init__(self, num_layers: int, slots: int) -> None:
        super().__init__(layers=[_SlotLayer(self, layer) for layer in range(num_layers)])
        self.slots = slots
        self.key_buffers: list[torch.Tensor] = []
        self.value_buffers: list[torch.Tensor] = []
        self.starts: list[int] = []
        self.width = 0

    @property
    def rows(self) -> int:
        return len(self.starts)

    @property
    def capacity(self) -> int:
        return self.key_buffers[0].shape[2] if self.key_buffers else 0

    def append_row(self, prefill: DynamicCache) -> None:
        """Add a row whose prompt's keys and values are ``prefill`` (a one-row cache of its prompt alone)."""
        if self.rows == self.slots:
            raise ValueError(f"all {self.slots} slots are taken")
        keys = [layer.keys for layer in prefill.layers]
        values = [layer.values for layer in prefill.layers]
        length = keys[0].shape[2]
        if not self.key_buffers:
            self._allocate(keys[0], values[0])
        if length > self.width:
            self._rebuild(shift=length - self.width)
        row, start = self.rows, self.width - length
        for layer, (key, value) in enumerate(zip(keys, values)):
            self.key_buffers[layer][row, :, start : self.width] = key[0]
            self.value_buffers[layer][row, :, start : self.width] = value[0]
        self.starts.append(start)

    def keep_rows(self, keep: list[bool]) -> list[int]:
        """Drop the rows whose ``keep`` is False; the last rows kept move into the freed slots. Returns, for each
        row now in the cache, the index it had before (the callers reorder their own per-row state with it)."""
        kept = [row for row, flag in enumerate(keep) if flag]
        order = list(range(len(kept)))
        holes = [row for row in range(len(kept)) if not keep[row]]
        movers = [row for row in kept if row >= len(kept)]
        for hole, mover in zip(holes, movers):
            start = self.starts[mover]
            for buffer in (*self.key_buffers, *self.value_buffers):
                buffer[hole, :, start : self.width] = buffer[mover, :, start : self.width]
            self.starts[hole] = self.starts[mover]
            order[hole] = mover
        del self.starts[len(kept) :]
        return order

    def positions(self) -> torch.Tensor:
        """``[rows, 1]``: the position of each row's next token (the number of tokens it holds)."""
        return torch.tensor([[self.width - start] for start in self.starts], device=self.key_buffers[0].device)

    def step_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The additive attention mask ``[rows, 1, 1, width + 1]`` of the next step: each row sees its own columns
        and the column the step writes. Additive (0 or the dtype's minimum) so eager attention can use it too."""
        self._ensure_free_column()
        device = self.key_buffers[0].device
        columns = torch.arange(self.width + 1, device=device)
        starts = torch.tensor(self.starts, device=device).unsqueeze(-1)
        blocked = columns.unsqueeze(0) < starts
        mask = torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill(blocked, torch.finfo(dtype).min)
        return mask[:, None, None, :]

    def write_step(
        self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the step's keys and values ``[rows, kv_heads, 1, head_dim]`` of ``layer`` in column ``width`` and
        return the rows' keys and values so far (views, no copy)."""
        if key_states.shape[2] != 1:
            raise ValueError("the slot cache decodes one token per row and step; prefill uses a DynamicCache")
        rows, keys, values = self.rows, self.key_buffers[layer], self.value_buffers[layer]
        keys[:rows, :, self.width] = key_states[:, :, 0]
        values[:rows, :, self.width] = value_states[:, :, 0]
        return keys[:rows, :, : self.width + 1], values[:rows, :, : self.width + 1]

    def advance(self) -> None:
        """Close a step: every row now holds the column the step wrote."""
        self.width += 1

    def _allocate(self, key: torch.Tensor, value: torch.Tensor) -> None:
        self.key_buffers = [key.new_zeros(self.slots, key.shape[1], 0, key.shape[3]) for _ in self.layers]
        self.value_buffers = [value.new_zeros(self.slots, value.shape[1], 0, value.shape[3]) for _ in self.layers]

    def _ensure_free_column(self) -> None:
        if self.width < self.capacity:
            return
        # Columns left of every row's start belong to rows that have left: drop them.
        self._rebuild(shift=-min(self.starts))

    def _rebuild(self, shift: int) -> None:
        """Copy the rows' columns ``shift`` columns to the right (left when negative) into fresh buffers with room
        to spare. Zeros, not ``empty``: masked columns are still multiplied by zero weights, and NaN * 0 is NaN."""
        width = self.width + shift
        rows, first = self.rows, min(self.starts, default=self.width)
        capacity = width + 1 + max(_MIN_SPARE_COLUMNS, width // 2)
        for buffers in (self.key_buffers, self.value_buffers):
            for layer, old in enumerate(buffers):
                new = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
                new[:rows, :, first + shift : width] = old[:rows, :, first : self.width]
                buffers[layer] = new
        self.starts = [start + shift for start in self.starts]
        self.width = width
