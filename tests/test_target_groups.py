"""Tensor-parallel target groups (``topology.target_tp``) end to end through ``train.py``, one plain process per
rank (gloo, CPU, fp32): ranks 0-1 form one group holding the target, rank 2 trains the drafter.

- A group over a mixture-of-experts target (``tests/helpers/moe_world.py``'s scale target of Qwen3-30B-A3B with 4 of its
  48 layers, each rank loading it costs seconds per layer; ``target_tp_plan=experts``: the 128 experts split
  over the group, attention on both ranks) trains the same per-step losses as one colocated process, and the run
  reports the group's peak bytes in flight (a metric and a log line).
- Killing one rank of a group ends every rank non-zero within ``stream.timeout_s``, each naming that rank.

Feature equality of a group against the colocated features is in ``tests/test_streaming_payloads.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.jobs.run import run_training
from tests.helpers.moe_world import moe_overrides
from tests.helpers.streaming_world import fail_one_rank_mid_run, recipe_overrides, run_ranks, step_losses

# Several processes each: a few seconds per test.
pytestmark = pytest.mark.slow

TIMEOUT_S = 10
GROUP = {"topology.target_workers": 2, "topology.target_tp": 2}


def test_a_group_over_a_moe_target_trains_the_colocated_losses(shallow_moe_world, tmp_path: Path) -> None:
    world = shallow_moe_world
    # The DFlash drafter: no vocabulary-sized Markov factors to train, the transport is what is tested here.
    steps = {"train.max_steps": 2, "train.global_batch_sequences": 2, "train.eval_every": 2, "target.layer_ids": "[1,2]",
             "drafter.kind": "dflash", "drafter.markov_rank": 0, "drafter.confidence_head": "false"}
    streamed, colocated = tmp_path / "streamed", tmp_path / "colocated"
    args = moe_overrides(world, streamed, **steps, **GROUP, **{"topology.target_tp_plan": "experts"})
    run_ranks(["recipe=qwen3-30b-a3b", *args], 3, tmp_path / "logs", timeout=300)
    run_training(load_recipe("qwen3-30b-a3b", moe_overrides(world, colocated, **steps)))
    expected, got = step_losses(colocated), step_losses(streamed)
    assert sorted(got) == sorted(expected) == [1, 2]
    for step in expected:
        assert abs(got[step] - expected[step]) <= 1e-5 * abs(expected[step]), (step, got[step], expected[step])
    records = [json.loads(line) for line in (streamed / "metrics.jsonl").read_text().splitlines()]
    peaks = [r["stream/peak_bytes_in_flight_group0"] for r in records if "stream/peak_bytes_in_flight_group0" in r]
    assert len(peaks) == 2 and peaks == sorted(peaks) and peaks[0] > 0
    sender_log = (tmp_path / "logs" / "rank0.log").read_text()
    assert "target group 0 (ranks 0-1) done" in sender_log and "MB in flight (stream.depth = 2 micro-batches)" in sender_log


def test_killing_one_rank_of_a_group_stops_every_rank_naming_it(streaming_world, tmp_path: Path) -> None:
    args = recipe_overrides(
        streaming_world, tmp_path, **GROUP,
        **{"train.max_steps": 100000, "stream.timeout_s": TIMEOUT_S, "train.eval_every": 100000},
    )
    codes, elapsed, logs = fail_one_rank_mid_run(args, 3, 1, tmp_path, TIMEOUT_S)
    # Every rank ended (the helper waits stream.timeout_s + 15 s at most) with the lost rank named below.
    assert all(code not in (0, None) for code in codes), (codes, elapsed, logs)
    for rank in (0, 2):
        text = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        assert "target group 0, TP rank 1 (rank 1)" in text, logs
