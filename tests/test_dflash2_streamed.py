"""DFlash2 streamed = colocated on the tiny world, bit for bit: ``tiny-dflash2`` (one layer, at the test world's
taps) trains 2 steps in this process and, at the same time, as 1 target worker + 1 drafter worker over gloo
through ``train.py``'s entry (``torch.distributed.run``); the per-step losses and the final weights (convolutions
and selector included) are equal.

The wire carries DFlash's tensors (the selector's candidates come from the drafter's own frozen LM head, on the
drafter worker), so this is the one streamed check of the kind in the default run; the Qwen3-8B copy streams in
the scale tier's `full` tier (``tests/test_scale_tier.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepspec_train.jobs.run import run_training
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.streaming_world import REPO, free_port, step_losses
from tests.helpers.tiny_world_overrides import training_overrides

# One intra-op thread here, as torchrun gives each streamed rank: both modes then reduce in the same order.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

RECIPE = "tiny-dflash2"
STEPS = 2


def _overrides(tiny_world: Path, out: Path) -> list[str]:
    return training_overrides(tiny_world, RECIPE, out, steps=STEPS) + ["drafter.num_layers=1"]


def test_dflash2_streamed_run_matches_colocated(tiny_world: Path, tmp_path: Path) -> None:
    streamed_out = tmp_path / "streamed"
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
              str(free_port()), "train.py", f"recipe={RECIPE}", *_overrides(tiny_world, streamed_out),
              "topology.target_workers=1"]
    # The streamed ranks start first and run while this process trains the colocated run.
    streamed = subprocess.Popen(launch, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cfg = load_recipe(RECIPE, _overrides(tiny_world, tmp_path / "colocated"))
        assert cfg.drafter.kind == "dflash2" and run_training(cfg).steps == STEPS
        output, _ = streamed.communicate(timeout=300)
    finally:
        if streamed.poll() is None:
            streamed.kill()
            streamed.wait()
    assert streamed.returncode == 0, output[-3000:]

    colocated_run, streamed_run = tmp_path / "colocated" / "run", streamed_out / "run"
    assert sorted(step_losses(colocated_run)) == list(range(1, STEPS + 1))
    assert step_losses(streamed_run) == step_losses(colocated_run)
    expected = load_file(str(colocated_run / "drafter" / "drafter.safetensors"))
    got = load_file(str(streamed_run / "drafter" / "drafter.safetensors"))
    assert got.keys() == expected.keys() and any(name.startswith("candidate_selector.") for name in expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
