"""The progress bar of ``deepspec regenerate``: it moves with every decoding step, not only when a row ends.

A bar that counts finished rows stands still for minutes while a batch decodes and then jumps, and its rate
(rows per second) and ETA are made of those jumps. This bar counts rows of work: a finished row is one, a row in
flight is the share of an expected answer it has generated (``in_flight / expected``, at most one). The expected
answer is this run's answer tokens so far (of the rows ended and of those in flight) per row ended, at most
``max_new_tokens`` (which it is until a row ends). Short answers end first, so the mean of the ended ones alone
would make the early ETA err short; this estimate errs long at first and settles as rows end. The rate is this
run's rows of work per second since it started; rows skipped on resume (already in the output) or unreadable count
on the bar but not in the rate. The ETA is the rows of work left divided by that rate. A backend that reports
tokens (``--backend local``) also shows its answer tokens per second; one that does not (HTTP) moves the bar row
by row.

    regenerate:  41%|████      | 19.6/48 rows [02:10, 61.3 answer tok/s, ETA 03:08, failed 0]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tqdm import tqdm

_WITH_TOTAL = "{l_bar}{bar}| {n:.1f}/{total_fmt} rows [{elapsed}{postfix}]"
_WITHOUT_TOTAL = "{desc}: {n:.1f} rows [{elapsed}{postfix}]"


class RegenerateProgress:
    """Rows done, rows in flight and answer tokens of one regeneration run, shown as one tqdm bar."""

    def __init__(
        self, total_rows: int | None, max_new_tokens: int, enabled: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total_rows = total_rows
        self.max_new_tokens = max_new_tokens
        self.clock = clock
        self.started = clock()
        # Rows that count on the bar without being this run's work.
        self.skipped = 0
        self.answered = 0
        self.failed = 0
        # Answer tokens generated in this run.
        self.tokens = 0
        self.tokens_known = False
        self.in_flight: list[int] = []
        self.bar = tqdm(
            total=total_rows, disable=not enabled, desc="regenerate",
            bar_format=_WITH_TOTAL if total_rows else _WITHOUT_TOTAL,
        )

    def __enter__(self) -> RegenerateProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def skip(self) -> None:
        """A row that is not this run's work (already done, or unreadable)."""
        self.skipped += 1
        self._show()

    def step(self, new_tokens: int, in_flight: Sequence[int]) -> None:
        """A decoding step generated ``new_tokens``; ``in_flight`` is each unfinished answer's length so far."""
        self.tokens_known = True
        self.tokens += new_tokens
        self.in_flight = list(in_flight)
        self._show()

    def row_finished(self, failed: bool) -> None:
        """A row of this run is done (written, or failed)."""
        if failed:
            self.failed += 1
        else:
            self.answered += 1
        self._show()

    def expected_tokens(self) -> float:
        """The expected answer length of a row (see the module docstring)."""
        if self.answered and self.tokens:
            return min(self.tokens / self.answered, float(self.max_new_tokens))
        return float(self.max_new_tokens)

    def work_done(self) -> float:
        """This run's rows of work: rows ended plus the shares of the rows in flight."""
        expected = self.expected_tokens()
        return self.answered + self.failed + sum(min(tokens / expected, 1.0) for tokens in self.in_flight)

    def eta_seconds(self) -> float | None:
        """Seconds left at this run's rate so far; None when there is no total or no rate yet."""
        done, elapsed = self.work_done(), self.clock() - self.started
        if self.total_rows is None or done <= 0 or elapsed <= 0:
            return None
        left = max(self.total_rows - self.skipped - done, 0.0)
        return left / (done / elapsed)

    def describe(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        parts = [f"{self.tokens / elapsed:,.1f} answer tok/s"] if self.tokens_known else []
        eta = self.eta_seconds()
        if eta is not None:
            parts.append(f"ETA {tqdm.format_interval(eta)}")
        parts.append(f"failed {self.failed}")
        return ", ".join(parts)

    def _show(self) -> None:
        if self.bar.disable:
            return
        self.bar.set_postfix_str(self.describe(), refresh=False)
        # tqdm redraws at most every ``mininterval`` seconds, however often a step ends.
        self.bar.update(self.skipped + self.work_done() - self.bar.n)
