"""What two training runs must share to count as the same training: the per-step losses and validation metrics
of ``metrics.jsonl`` (timings left out: they differ run to run) and the final drafter weights, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

# The logged keys that depend on the training alone, not on the machine or the clock.
TRAINING_KEYS = ("train/loss", "train/ce", "train/tv", "val/")


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def history(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per step, the losses and validation metrics a run logged."""
    steps: dict[int, dict[str, float]] = {}
    for record in records(run_dir):
        kept = {k: v for k, v in record.items() if k.startswith(TRAINING_KEYS)}
        steps.setdefault(record["step"], {}).update(kept)
    return steps


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "drafter" / "drafter.safetensors"))


def assert_same_training(got: Path, expected: Path) -> None:
    """``got`` logged the same losses and metrics at every step as ``expected`` and ended with equal weights."""
    got_history, expected_history = history(got), history(expected)
    differing = {step: (got_history.get(step), expected_history.get(step))
                 for step in sorted(set(got_history) | set(expected_history))
                 if got_history.get(step) != expected_history.get(step)}
    assert not differing, f"steps whose logged training differs (got, expected): {differing}"
    a, b = weights(got), weights(expected)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
