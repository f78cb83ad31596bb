"""Failure handling in streamed mode: when the target worker is killed mid-run, every drafter worker exits
non-zero within ``stream.timeout_s`` with a message naming the dead target worker, and nothing hangs."""

from __future__ import annotations

import time

import pytest

from tests.streaming_helpers import read_logs, recipe_overrides, start_ranks, step_losses, wait_all

# Several processes each: a few seconds per test.
pytestmark = pytest.mark.slow

TIMEOUT_S = 20


def test_killing_the_target_stops_every_drafter_with_a_named_error(streaming_world, tmp_path) -> None:
    args = recipe_overrides(
        streaming_world, tmp_path, **{"topology.target_workers": 1, "train.max_steps": 100000,
                                      "stream.timeout_s": TIMEOUT_S, "train.eval_every": 100000}
    )
    procs = start_ranks(["train.py", *args], 3, tmp_path / "logs")
    try:
        deadline = time.monotonic() + 240
        while len(step_losses(tmp_path)) < 2:
            assert time.monotonic() < deadline, read_logs(tmp_path / "logs", 3)
            assert all(p.poll() is None for p in procs), read_logs(tmp_path / "logs", 3)
            time.sleep(0.2)
        procs[0].kill()
        killed_at = time.monotonic()
        codes = wait_all(procs[1:], timeout=TIMEOUT_S + 15)
        elapsed = time.monotonic() - killed_at
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    logs = read_logs(tmp_path / "logs", 3)
    assert all(code not in (0, None) for code in codes), (codes, logs)
    assert elapsed < TIMEOUT_S + 10, (elapsed, logs)
    for rank in (1, 2):
        text = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        assert "target worker 0 (rank 0)" in text, logs
