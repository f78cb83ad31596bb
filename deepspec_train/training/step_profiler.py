"""``train.profile``: a torch profiler trace of a few training steps per drafter rank.

The trainer calls ``step()`` after each optimizer step. The profiler skips the first step (set-up, first
compiles), warms up on the second and records the next ``ACTIVE_STEPS``, then writes a Chrome trace (open it in
Perfetto or chrome://tracing) to ``<output_dir>/profile/rank<R>.json`` and stops: CPU ops always, CUDA kernels and
memory when the drafter runs on a GPU. Host syncs show there as ``cudaStreamSynchronize`` / ``cudaMemcpy`` calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch.profiler import ProfilerActivity, profile, schedule

WAIT_STEPS, WARMUP_STEPS, ACTIVE_STEPS = 1, 1, 3


class StepProfiler:
    """Profiles steps ``WAIT_STEPS + WARMUP_STEPS + 1 ..`` of this rank when ``enabled``; a no-op otherwise."""

    def __init__(self, enabled: bool, out_dir: Path, rank: int, device: torch.device) -> None:
        self.path = out_dir / "profile" / f"rank{rank}.json"
        self._profiler: Optional[profile] = None
        if not enabled:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self._profiler = profile(
            activities=activities,
            schedule=schedule(wait=WAIT_STEPS, warmup=WARMUP_STEPS, active=ACTIVE_STEPS, repeat=1),
            on_trace_ready=self._write,
            record_shapes=True,
            profile_memory=device.type == "cuda",
        )
        self._profiler.start()

    def _write(self, prof: profile) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))

    def step(self) -> None:
        if self._profiler is not None:
            self._profiler.step()

    def close(self) -> None:
        """Stop profiling (a run shorter than the schedule writes what it recorded)."""
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
