"""Exact resume in streamed mode (1 target + 1 drafter, gloo, CPU fp32): 10 steps, then ``train.resume=auto``
for 10 more, gives the same per-step losses as 20 uninterrupted steps (trained colocated in this process: the
streamed features are the colocated ones, ``test_streaming_launch``). 20 steps cross an epoch boundary
(12 steps per epoch here), so the data position, the LR schedule, the optimizer and the RNG all have to come
back right; the checkpoint holds only safetensors, JSON and tensor-only ``torch.save`` files. The resumed run's
log lines come from each role's own rank 0."""

from __future__ import annotations

import json

import pytest
import torch

from deepspec_train.training.checkpoint import list_checkpoints
from tests.helpers.streaming_world import recipe_overrides, run_ranks, step_losses, train_in_process

# Several processes each: a few seconds per test.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def test_resumed_streamed_run_matches_uninterrupted(streaming_world, tmp_path) -> None:
    common = {"topology.target_workers": 1, "train.max_steps": 20, "train.eval_every": 1000, "train.checkpoint_every": 1000}
    full, split = tmp_path / "full", tmp_path / "split"
    train_in_process(streaming_world, full, **common | {"topology.target_workers": 0})
    run_ranks(recipe_overrides(streaming_world, split, **common, **{"train.stop_at_step": 10}), 2, split / "logs1")
    stopped = list_checkpoints(split)
    assert [p.name for p in stopped] == ["step_00000010"]
    state = json.loads((stopped[0] / "trainer_state.json").read_text())
    assert state["step"] == 10 and state["data"] == {"epoch": 0, "step_in_epoch": 10}
    torch.load(stopped[0] / "optimizer.pt", weights_only=True)
    run_ranks(recipe_overrides(streaming_world, split, **common, **{"train.resume": "auto"}), 2, split / "logs2")

    expected, resumed = step_losses(full), step_losses(split)
    assert sorted(expected) == list(range(1, 21)) and sorted(resumed) == list(range(1, 21))
    for step in range(1, 21):
        assert abs(expected[step] - resumed[step]) <= 1e-6, (step, expected[step], resumed[step])

    # Each role's rank 0 speaks for its role: the drafter's resume and summary lines come from drafter worker 0
    # (global rank 1), the target's from target worker 0.
    drafter_log, target_log = (split / "logs2" / "rank1.log").read_text(), (split / "logs2" / "rank0.log").read_text()
    assert f"resumed from {stopped[0]} at step 10" in drafter_log, drafter_log
    assert "done: 20 steps" in drafter_log and "final loss" in drafter_log, drafter_log
    assert "target worker 0 (rank 0) done" in target_log and "resumed from" not in target_log, target_log
