"""Profiled target verification speed: steps per second as a function of the verification batch size.

The scheduler trades expected accepted tokens against verification cost; the cost side is ``SPS(B)``, the number
of target verification steps per second when one step scores ``B`` tokens in total. A profile measures it at a
few batch sizes (``deepspec simulate`` or a serving benchmark writes the JSON file); ``sps(B)`` interpolates
between them piecewise-linearly, which keeps a monotone profile monotone and a concave one concave (the
greedy scheduler's early stop is exact for non-increasing concave profiles; see ``greedy_prefix``).

Outside the profiled range: below the smallest size the speed is taken as constant (a smaller batch is assumed
no faster than the smallest one measured, which is conservative); above the largest size the *step time*
``1 / SPS`` keeps growing linearly at the rate of the last profiled segment (the compute-bound regime, where
time grows with tokens), never shrinking.

JSON layout: ``{"batch_sizes": [...], "steps_per_s": [...]}``.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Sequence, Union


class SPSTable:
    """Verification steps per second at profiled batch sizes (strictly increasing, positive), interpolated."""

    def __init__(self, batch_sizes: Sequence[float], steps_per_s: Sequence[float]) -> None:
        sizes = [float(b) for b in batch_sizes]
        speeds = [float(s) for s in steps_per_s]
        if not sizes or len(sizes) != len(speeds):
            raise ValueError(f"need as many speeds as batch sizes (at least one); got {len(sizes)} and {len(speeds)}")
        if any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 0:
            raise ValueError(f"batch sizes must be non-negative and strictly increasing, got {sizes}")
        if any(s <= 0 for s in speeds):
            raise ValueError(f"steps per second must be positive, got {speeds}")
        self.batch_sizes = sizes
        self.steps_per_s = speeds

    def sps(self, batch_tokens: float) -> float:
        """Steps per second for a verification batch of ``batch_tokens`` tokens."""
        sizes, speeds = self.batch_sizes, self.steps_per_s
        if batch_tokens <= sizes[0]:
            return speeds[0]
        if batch_tokens >= sizes[-1]:
            if len(sizes) == 1:
                return speeds[0]
            last_time, prev_time = 1.0 / speeds[-1], 1.0 / speeds[-2]
            time_slope = max((last_time - prev_time) / (sizes[-1] - sizes[-2]), 0.0)
            return 1.0 / (last_time + time_slope * (batch_tokens - sizes[-1]))
        i = bisect.bisect_right(sizes, batch_tokens)
        w = (batch_tokens - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
        return (1.0 - w) * speeds[i - 1] + w * speeds[i]

    def to_dict(self) -> dict[str, list[float]]:
        return {"batch_sizes": list(self.batch_sizes), "steps_per_s": list(self.steps_per_s)}

    @classmethod
    def from_dict(cls, data: dict) -> "SPSTable":
        unknown = set(data) - {"batch_sizes", "steps_per_s"}
        if unknown:
            raise ValueError(f"unknown SPS table keys: {sorted(unknown)}")
        return cls(data["batch_sizes"], data["steps_per_s"])

    def save(self, path: Union[str, Path]) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Union[str, Path]) -> "SPSTable":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def __repr__(self) -> str:
        return f"SPSTable(batch_sizes={self.batch_sizes}, steps_per_s={self.steps_per_s})"
