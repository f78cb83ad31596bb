"""No host sync on the trainer's hot path: outside logging steps a training step reads one device value into Python
(the ``training.step_guard`` verdict), counted by ``bench/host_syncs.py`` over ``bench/step_time.py``'s trainer
(a DSpark drafter, 4 micro-batches a step). Before this was built the same count was 37 per step."""

from __future__ import annotations

import torch

from bench.step_time import measure


def test_a_training_step_reads_the_device_at_most_once_outside_logging_steps() -> None:
    result = measure(steps=6, device=torch.device("cpu"))
    assert result["syncs_per_step"] <= 1, result
    # A logging step adds the one reduction of its metrics and their reads.
    assert result["syncs_per_log_step"] <= 4, result


def test_the_target_forwards_of_a_step_read_nothing_so_a_whole_step_reads_once() -> None:
    """A colocated step's target forwards (one padded chunk, one not) read no device value with the tap's own
    layer masks; with transformers' mask building they read 1 (no padding) + 2 (padding)."""
    from bench.target_syncs import target_reads

    tap, own_masks = target_reads(builds_masks=True), target_reads(builds_masks=False)
    assert tap["forwards"] == own_masks["forwards"] == 2
    assert own_masks["reads"] == 3, own_masks
    assert tap["reads"] == 0, tap
    assert tap["reads"] + measure(steps=6, device=torch.device("cpu"))["syncs_per_step"] <= 1
