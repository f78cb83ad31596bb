"""End to end through the real launcher: ``accelerate launch`` with ``launch/accelerate/single_node.yaml`` and 2
processes runs 1 target worker + 1 drafter worker on CPU, and its per-step losses equal a colocated
single-process run of the same recipe exactly (the streamed features are the colocated ones, bit for bit)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.jobs.run import run_training
from tests.helpers.streaming_world import REPO, free_port, recipe_overrides, run_ranks, step_losses

# Several processes each: a few seconds per test.
pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("accelerate") is None, reason="accelerate CLI not installed")
def test_accelerate_launch_one_target_one_drafter(streaming_world, tmp_path) -> None:
    streamed, colocated = tmp_path / "streamed", tmp_path / "colocated"
    args = recipe_overrides(streaming_world, streamed, **{"topology.target_workers": 1})
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", "launch/accelerate/single_node.yaml",
        "--num_processes", "2", "--main_process_port", str(free_port()), "train.py", *args,
    ]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert (streamed / "drafter" / "drafter.safetensors").is_file()

    overrides = recipe_overrides(streaming_world, colocated, **{"topology.target_workers": 0})
    run_training(load_recipe(overrides[0].split("=", 1)[1], overrides[1:]))
    expected, got = step_losses(colocated), step_losses(streamed)
    assert sorted(got) == [1, 2, 3, 4]
    assert got == expected
    records = [json.loads(line) for line in (streamed / "metrics.jsonl").read_text().splitlines()]
    stream = [r for r in records if "stream/target_wait_frac" in r]
    assert len(stream) == 4
    assert all(0.0 <= r["stream/target_wait_frac"] <= 1.0 and r["stream/wire_bytes_per_supervised_token"] > 0 for r in stream)


@pytest.mark.parametrize("normalizer", ["token", "sequence"])
def test_three_drafters_with_uneven_shares_train_the_single_process_losses(streaming_world, tmp_path, normalizer) -> None:
    """1 target feeds 3 drafters 4 sequences per step (shares 2, 1, 1): the loss is normalised over the supervised
    slots of all drafters (or, per sequence, by each sequence's weight from the outlines' slot counts), so every
    step's loss is the one process's on all 4 (up to the order of the sums). Validation runs too. Regression: with
    several drafters, a drafter's step outline queued behind another drafter's micro-batches would deadlock
    against the all-reduce of the step's supervised count."""
    streamed, single = tmp_path / "streamed", tmp_path / "single"
    settings = {"train.eval_every": 2, "loss.normalizer": normalizer}
    args = recipe_overrides(streaming_world, streamed, **{"topology.target_workers": 1, **settings})
    run_ranks(args, world_size=4, log_dir=tmp_path / "logs", timeout=240)
    overrides = recipe_overrides(streaming_world, single, **{"topology.target_workers": 0, **settings})
    run_training(load_recipe(overrides[0].split("=", 1)[1], overrides[1:]))
    expected, got = step_losses(single), step_losses(streamed)
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
    for step in expected:
        assert abs(got[step] - expected[step]) <= 1e-6 * abs(expected[step]), (step, got[step], expected[step])
    records = [json.loads(line) for line in (streamed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val/loss" in r] == [2, 4]
