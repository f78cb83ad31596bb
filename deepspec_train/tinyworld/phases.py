"""Phase lines of ``deepspec tinyworld build``: which of its phases runs now, what it does, and how long it took.

The build runs for minutes through phases of very different kinds (some with their own tqdm bar, like target
training or regeneration, some without any), so each phase announces itself on one line as it starts and says its
time as it ends. Lines go to stderr with the bars, through ``tqdm.write`` so that they never tear one (the verb's
results stay alone on stdout); ``--no-progress`` silences them with the bars. The same timings land in
``build_report.json``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm


class BuildPhases:
    """Announces numbered phases and records each one's seconds under ``timings[<key>_s]``."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.enabled = enabled
        self.timings: dict[str, float] = {}
        self._started = time.perf_counter()
        self._count = 0

    def _say(self, line: str) -> None:
        if self.enabled:
            tqdm.write(line, file=sys.stderr)

    @contextmanager
    def phase(self, key: str, description: str) -> Iterator[None]:
        """Run the body as phase ``key``: one line before it (``description``), one with its time after it."""
        self._count += 1
        label = f"tinyworld [{self._count}/{self.total}]"
        self._say(f"{label} {description}")
        clock = time.perf_counter()
        yield
        self.timings[f"{key}_s"] = time.perf_counter() - clock
        self._say(f"{label} {key.replace('_', ' ')} done in {self.timings[f'{key}_s']:.1f} s")

    def finish(self) -> dict[str, float]:
        """The timings of every phase and of the whole build (``total_s``)."""
        self.timings["total_s"] = time.perf_counter() - self._started
        return self.timings
