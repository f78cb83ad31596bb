"""``deepspec profile-sps``: step layouts and monotone repair against brute force, the timed step really runs
the planned tokens against a cache of ``context_len``, and a small run on the tiny random target writes a sane
SPS table."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from deepspec_train.cli import main
from deepspec_train.scheduling.profile_sps import measure_batch_size, monotone_speeds, step_shape
from deepspec_train.scheduling.sps_table import SPSTable
from tests.tiny_random_model import save_tiny_chat_model


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny_target"))


def test_step_shape_is_the_fewest_equal_requests():
    for per_request in range(1, 10):
        for batch in range(1, 70):
            shape = step_shape(batch, per_request)
            fewest = min(r for r in range(1, batch + 1) if r * per_request >= batch)
            assert shape.requests == fewest
            assert shape.tokens_per_request <= per_request
            # Enough room for every token, and less than one extra token per request.
            assert batch <= shape.tokens < batch + shape.requests


def test_monotone_speeds_is_the_best_speed_at_any_larger_batch():
    raw = [50.0, 20.0, 47.0, 45.0, 17.0, 12.0, 30.0]
    assert monotone_speeds(raw) == [max(raw[i:]) for i in range(len(raw))]


def test_every_timed_step_runs_the_planned_tokens_on_the_same_context(tiny_target):
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    seen = []

    def record(module, args, kwargs):
        cache = kwargs.get("cache")
        seen.append((tuple(kwargs["input_ids"].shape), cache.get_seq_length() if cache is not None else 0))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        measurement = measure_batch_size(model, 12, context_len=9, repeats=3, warmup=2, max_tokens_per_request=8)
    finally:
        handle.remove()
    assert (measurement.shape.requests, measurement.shape.tokens_per_request) == (2, 6)
    assert seen[0] == ((2, 9), 0)  # the untimed prefill that builds the cache
    assert seen[1:] == [((2, 6), 9)] * 5  # warm-up and timed steps all see exactly the context
    assert len(measurement.step_seconds) == 3 and all(s > 0 for s in measurement.step_seconds)


def test_profile_command_writes_a_sane_table(tiny_target, tmp_path, capsys):
    out = tmp_path / "sps.json"
    sizes = [1, 2, 4, 8, 16, 32]
    args = [
        "profile-sps",
        "--target",
        tiny_target,
        "--batch-sizes",
        ",".join(map(str, sizes)),
        "--context-len",
        "16",
        "--repeats",
        "3",
        "--warmup",
        "1",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    assert set(json.loads(out.read_text())) == {"batch_sizes", "steps_per_s"}
    table = SPSTable.load(out)
    assert table.batch_sizes == sizes
    assert all(s > 0 and s < 1e6 for s in table.steps_per_s)
    assert all(b <= a for a, b in zip(table.steps_per_s, table.steps_per_s[1:]))
    printed = capsys.readouterr().out
    assert "4 x 8" in printed and "SPS table written" in printed


def test_profile_command_rejects_unsorted_sizes(tiny_target, tmp_path):
    assert (
        main(
            [
                "profile-sps",
                "--target",
                tiny_target,
                "--batch-sizes",
                "4,2",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "sps.json"),
            ]
        )
        == 2
    )
