"""Failure handling in streamed mode: when the target worker is killed mid-run, every drafter worker exits
non-zero with a message naming the dead target worker as dead (the death seen, not the deadline); when it is
stopped (SIGSTOP), with a message naming it as timed out, not before ``stream.timeout_s``; when a drafter is killed inside the drafters' gradient
all-reduce, the other drafter names it as dead instead of failing with a traceback. Nothing hangs."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.streaming_world import fail_one_rank_mid_run, recipe_overrides

# Several processes each: a few seconds per test.
pytestmark = pytest.mark.slow

TIMEOUT_S = 20


def fail_a_rank(world: dict, tmp_path: Path, how: signal.Signals, rank: int = 0) -> tuple[list[int], float, str]:
    """Start 1 target + 2 drafters, send ``rank`` ``how`` after two steps; (the others' codes, seconds, logs)."""
    args = recipe_overrides(
        world, tmp_path, **{"topology.target_workers": 1, "train.max_steps": 100000,
                            "stream.timeout_s": TIMEOUT_S, "train.eval_every": 100000}
    )
    return fail_one_rank_mid_run(args, 3, rank, tmp_path, TIMEOUT_S, how)


def error_lines(log_dir: Path, rank: int) -> list[str]:
    return [line for line in (log_dir / f"rank{rank}.log").read_text().splitlines() if line.startswith("error:")]


def test_killing_the_target_stops_every_drafter_with_a_named_error(streaming_world, tmp_path) -> None:
    codes, elapsed, logs = fail_a_rank(streaming_world, tmp_path, signal.SIGKILL)
    # Ended (``fail_a_rank`` waits stream.timeout_s + 15 s at most), and by the death being seen, not by the
    # deadline: the event the message names, rather than a wall-clock bound a loaded machine would stretch.
    assert all(code not in (0, None) for code in codes), (codes, elapsed, logs)
    for rank in (1, 2):
        (line,) = error_lines(tmp_path / "logs", rank)
        assert f"drafter worker {rank - 1} (rank {rank})" in line and "target worker 0 (rank 0)" in line, logs
        assert "died" in line and "timed out" not in line, logs


def test_stopping_the_target_is_reported_as_a_timeout(streaming_world, tmp_path) -> None:
    codes, elapsed, logs = fail_a_rank(streaming_world, tmp_path, signal.SIGSTOP)
    assert all(code not in (0, None) for code in codes), (codes, logs)
    # A stopped peer keeps its connections open: only the deadline can catch it, so not before it (a lower bound,
    # which load can only lengthen); that it did end is the codes above.
    assert TIMEOUT_S - 1 < elapsed, (elapsed, logs)
    for rank in (1, 2):
        (line,) = error_lines(tmp_path / "logs", rank)
        assert f"drafter worker {rank - 1} (rank {rank})" in line and "target worker 0 (rank 0) timed out" in line, logs
        # The other drafter may have left first (on its own timeout); only it can be named as gone.
        assert "target worker 0 (rank 0) died" not in line and "target worker 0 (rank 0), " not in line, logs


def test_a_drafter_killed_in_the_all_reduce_is_named_by_the_other_drafter(streaming_world, tmp_path) -> None:
    codes, elapsed, logs = fail_a_rank(streaming_world, tmp_path, signal.SIGKILL, rank=2)
    assert all(code not in (0, None) for code in codes), (codes, elapsed, logs)
    (line,) = error_lines(tmp_path / "logs", 1)
    # The target worker may have exited on the same death before this drafter looked: then both are named.
    assert line.startswith("error: [rank 1] drafter worker 0 (rank 1): "), logs
    assert "drafter worker 1 (rank 2) died during a collective" in line, logs
    assert "Traceback" not in (tmp_path / "logs" / "rank1.log").read_text(), logs
