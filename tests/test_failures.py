"""Failure handling in streamed mode: when the target worker is killed mid-run, every drafter worker exits
non-zero within ``stream.timeout_s`` with a message naming the dead target worker, and nothing hangs."""

from __future__ import annotations

import pytest

from tests.streaming_helpers import kill_one_rank_mid_run, recipe_overrides

# Several processes each: a few seconds per test.
pytestmark = pytest.mark.slow

TIMEOUT_S = 20


def test_killing_the_target_stops_every_drafter_with_a_named_error(streaming_world, tmp_path) -> None:
    args = recipe_overrides(
        streaming_world, tmp_path, **{"topology.target_workers": 1, "train.max_steps": 100000,
                                      "stream.timeout_s": TIMEOUT_S, "train.eval_every": 100000}
    )
    codes, elapsed, logs = kill_one_rank_mid_run(args, 3, 0, tmp_path, TIMEOUT_S)
    assert all(code not in (0, None) for code in codes), (codes, logs)
    assert elapsed < TIMEOUT_S + 10, (elapsed, logs)
    for rank in (1, 2):
        text = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        assert "target worker 0 (rank 0)" in text, logs
