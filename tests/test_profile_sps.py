"""``deepspec profile-sps``: step layouts and monotone repair against brute force, the timed step really runs
the planned tokens against a cache of ``context_len``, and a small run on the tiny random target writes a sane
SPS table."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from deepspec_train.commands.dispatch import main
from deepspec_train.export.engine_files import check_sps, read_sps, strict_json_loads
from deepspec_train.scheduling.profile_sps import measure_batch_size, monotone_speeds, profile_target, step_shape
from deepspec_train.scheduling.sps_table import SPSTable
from tests.helpers.tiny_chat_model import save_tiny_chat_model


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


def recorded_forwards(model, run):
    """``run()``'s result and the (input shape, cached length) of every forward of ``model`` during it."""
    seen = []

    def record(module, args, kwargs):
        cache = kwargs.get("cache")
        seen.append((tuple(kwargs["input_ids"].shape), cache.get_seq_length() if cache is not None else 0))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        return run(), seen
    finally:
        handle.remove()


def test_every_timed_step_runs_the_planned_tokens_on_the_same_context(tiny_target):
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    measurement, seen = recorded_forwards(
        model, lambda: measure_batch_size(model, 12, context_len=9, repeats=3, warmup=2, max_tokens_per_request=8))
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
    # Sparse probes: SGLang reads its table without interpolation, so none is written.
    assert "no SGLang table" in printed and not (tmp_path / "sps.sglang.json").exists()


def test_dense_profile_writes_sglang_table(tiny_target, tmp_path, capsys):
    out = tmp_path / "sps.json"
    args = ["profile-sps", "--target", tiny_target, "--max-batch-tokens", "12", "--context-len", "8",
            "--repeats", "2", "--warmup", "1", "--device", "cpu", "--threads", "1", "--out", str(out)]
    assert main(args) == 0
    assert "SGLang SPS table (12 probes) written" in capsys.readouterr().out
    ours = SPSTable.load(out)
    sglang = strict_json_loads((tmp_path / "sps.sglang.json").read_text())
    assert set(sglang) == {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    assert sglang["sample_batch_tokens"] == list(range(1, 13)) and sglang["max_batch_tokens"] == 12
    assert all(isinstance(b, int) for b in sglang["sample_batch_tokens"])
    assert sglang["sample_steps_per_sec"] == ours.steps_per_s and ours.batch_sizes == list(range(1, 13))
    assert read_sps(tmp_path / "sps.sglang.json") == sglang
    assert main(args[:-2] + ["--out", str(tmp_path / "x.json"), "--max-batch-tokens", "1"]) == 2


def test_sizes_sharing_a_request_count_share_one_prefilled_cache(tiny_target):
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    # 9..16 tokens at 8 per request are all 2 requests; 17 needs 3.
    measurements, seen = recorded_forwards(
        model, lambda: profile_target(model, list(range(9, 18)), context_len=5, repeats=2, warmup=1))
    prefills = [shape for shape, cached in seen if cached == 0]
    assert prefills == [(2, 5), (3, 5)]
    assert all(cached == 5 for shape, cached in seen if cached)
    assert [m.shape.requests for m in measurements] == [2] * 8 + [3]
    assert [m.shape.tokens for m in measurements] == [10, 10, 12, 12, 14, 14, 16, 16, 18]


@pytest.mark.parametrize(
    "table, message",
    [
        ({"sample_batch_tokens": [1], "sample_steps_per_sec": [5.0], "max_batch_tokens": 1}, "one probe"),
        ({"sample_batch_tokens": [1, 3, 2], "sample_steps_per_sec": [5.0, 4.0, 3.0], "max_batch_tokens": 3},
         "strictly increasing"),
        ({"sample_batch_tokens": [1.0, 2.0], "sample_steps_per_sec": [5.0, 4.0], "max_batch_tokens": 2}, "ints"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [5.0, float("nan")], "max_batch_tokens": 2},
         "positive numbers"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [5.0, 4.0], "max_batch_tokens": 1}, ">= the last"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [5.0, 4.0], "max_batch_tokens": 2, "x": 1},
         "unknown keys"),
    ],
)
def test_sglang_table_schema_is_enforced(table, message):
    with pytest.raises(ValueError, match=message):
        check_sps(table)


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
