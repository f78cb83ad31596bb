"""Checks shared by the preemption tests (``test_preemption``, ``test_feature_reuse``): wait for a run to log some
steps, verify that a SIGTERM left exactly one whole checkpoint and one log line, and compare a resumed run with an
uninterrupted one (per-step losses and final weights, bit for bit)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from deepspec_train.training.checkpoint import list_checkpoints
from deepspec_train.training.checkpoint_manifest import checkpoint_problem
from tests.helpers.streaming_world import step_losses


def wait_for_steps(out: Path, count: int, procs: list[subprocess.Popen], logs: str) -> None:
    deadline = time.monotonic() + 240
    while len(step_losses(out)) < count:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), logs
        time.sleep(0.05)


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "drafter" / "drafter.safetensors"))


def assert_same_run(full: Path, resumed: Path, steps: int) -> None:
    """``resumed`` logged the same loss as ``full`` at each of its ``steps`` steps and ended with its weights."""
    expected, got = step_losses(full), step_losses(resumed)
    assert sorted(expected) == list(range(1, steps + 1)) and sorted(got) == sorted(expected)
    assert [got[s] for s in sorted(got)] == [expected[s] for s in sorted(expected)], (expected, got)
    a, b = final_weights(full), final_weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def preempted_once(out: Path, log_text: str) -> int:
    """The step the run stopped after: checks its single checkpoint and the single log line."""
    kept = list_checkpoints(out)
    assert len(kept) == 1 and checkpoint_problem(kept[0]) is None, (kept, log_text)
    step = int(kept[0].name.removeprefix("step_"))
    lines = [line for line in log_text.splitlines() if "preempted by" in line]
    assert len(lines) == 1 and f"stopped after step {step}," in lines[0], log_text
    assert sorted(step_losses(out)) == list(range(1, step + 1)), log_text
    assert not (out / "drafter").exists()
    return step
