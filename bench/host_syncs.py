"""Count the reads of tensor values into Python inside a region of code: each one is a host sync on a GPU.

    with HostSyncCounter() as syncs:
        ...                       # a training step
    print(syncs.count, syncs.by_kind)

``item``, ``tolist``, ``__bool__``, ``__float__``, ``__int__`` and ``__index__`` of ``torch.Tensor`` are wrapped
while the counter is active; a call made by another counted call (``tolist`` calling ``__index__``...) counts once.
On a CPU-only machine nothing waits for a device, but the same calls are the ones that stall a CUDA stream, so the
count taken on CPU is the count a GPU run pays. Used by ``bench/step_time.py``, ``bench/gpu_check.py`` and
``tests/test_host_syncs.py``.
"""

from __future__ import annotations

import collections
import functools
import traceback
from typing import Callable, Optional

import torch

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


class HostSyncCounter:
    """Counts tensor-to-host reads while active; ``where`` (when true) keeps the caller of each read."""

    def __init__(self, where: bool = False) -> None:
        self.count = 0
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.callers: collections.Counter[str] = collections.Counter()
        self._where = where
        self._depth = 0
        self._saved: dict[str, Callable] = {}

    def reset(self) -> None:
        self.count = 0
        self.by_kind.clear()
        self.callers.clear()

    def _wrap(self, name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def counted(tensor: torch.Tensor, *args, **kwargs):
            if self._depth == 0:
                self.count += 1
                self.by_kind[name] += 1
                if self._where:
                    frame = traceback.extract_stack(limit=2)[0]
                    self.callers[f"{frame.filename}:{frame.lineno} {name}"] += 1
            self._depth += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def __enter__(self) -> "HostSyncCounter":
        for name in READS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc: object) -> Optional[bool]:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
        return None
