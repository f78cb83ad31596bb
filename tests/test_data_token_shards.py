"""Tests of the cached tokenised dataset: columns, bad-row accounting, strict mode and cache reuse."""

from __future__ import annotations

import json
import os

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deepspec_train.data import token_shards
from deepspec_train.data.conversations import BadRow, write_conversations_jsonl
from deepspec_train.data.loss_mask import render_with_loss_mask
from tests.helpers.chat_tokenizer import build_chat_tokenizer

GOOD = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]},
    {"conversations": [{"from": "human", "value": "2+3?"}, {"from": "gpt", "value": "<think>\nadd\n</think>\n\n5"}]},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi"},
            {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "Bye"},
        ]
    },
]
EMPTY_ANSWER = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}
LONG = {"messages": [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"}]}
MAX_LENGTH = 128

# One line per bad-row reason, in file order after the three good rows (lines 4..9).
BAD_LINES = [
    ("{broken json", "invalid_json"),
    (json.dumps({"messages": [{"role": "user"}]}), "missing_field"),
    (json.dumps({"messages": [{"role": "tool", "content": "x"}]}), "unknown_role"),
    (json.dumps(EMPTY_ANSWER), "empty_assistant"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}), "nothing_to_supervise"),
    (json.dumps(LONG), "too_long"),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_chat_tokenizer(tmp_path_factory.mktemp("chat_tokenizer"))


@pytest.fixture()
def mixed_file(tmp_path):
    path = tmp_path / "mixed.jsonl"
    lines = [json.dumps(row) for row in GOOD] + [line for line, _ in BAD_LINES]
    path.write_text("\n".join(lines) + "\n")
    return path


def build(sources, tokenizer, cache_dir, chat_template_kwargs=None, **kwargs):
    renderer = token_shards.ConversationRenderer(tokenizer, MAX_LENGTH, chat_template_kwargs)
    return token_shards.build_token_dataset(
        [str(s) for s in sources], renderer, str(cache_dir), progress=False, **kwargs
    )


def test_columns_match_direct_rendering(tokenizer, mixed_file, tmp_path):
    dataset, summary = build([mixed_file], tokenizer, tmp_path / "cache")
    assert dataset.column_names == ["input_ids", "loss_mask", "sample_id", "length"]
    assert dataset.features["loss_mask"].feature.dtype == "int8"
    assert dataset.features["sample_id"].dtype == "int64"
    assert summary.kept == len(dataset) == 3
    expected = []
    for row in GOOD:
        turns = row.get("messages") or [
            {"role": {"human": "user", "gpt": "assistant"}[t["from"]], "content": t["value"]}
            for t in row["conversations"]
        ]
        expected.append(render_with_loss_mask(tokenizer, turns))
    for index, (input_ids, loss_mask) in enumerate(expected):
        sample = dataset[index]
        assert sample["input_ids"] == input_ids and sample["loss_mask"] == loss_mask
        assert sample["sample_id"] == index and sample["length"] == len(input_ids)
    assert summary.supervised_tokens == sum(sum(mask) for _, mask in expected)
    assert summary.total_tokens == sum(len(ids) for ids, _ in expected)


def test_every_bad_reason_is_counted_and_summarised(tokenizer, mixed_file, tmp_path):
    _, summary = build([mixed_file], tokenizer, tmp_path / "cache")
    assert summary.skipped == {reason: 1 for _, reason in BAD_LINES}
    assert summary.first_bad["reason"] == "invalid_json" and summary.first_bad["where"] == f"{mixed_file}:4"
    lines = summary.format().splitlines()
    assert lines[0].startswith("kept 3 conversations") and "built cache" in lines[0]
    assert sorted(lines[1:]) == sorted(f"skipped 1: {reason}" for _, reason in BAD_LINES)


@pytest.mark.parametrize("line_index", range(len(BAD_LINES)))
def test_strict_stops_at_the_first_bad_row_naming_file_and_line(tokenizer, tmp_path, line_index):
    line, reason = BAD_LINES[line_index]
    path = tmp_path / "one_bad.jsonl"
    path.write_text(json.dumps(GOOD[0]) + "\n" + line + "\n" + line + "\n")
    with pytest.raises(BadRow) as error:
        build([path], tokenizer, tmp_path / "cache", strict=True)
    assert error.value.reason == reason and error.value.where == f"{path}:2"
    assert f"{path}:2" in str(error.value)
    assert not any((tmp_path / "cache").iterdir()), "a failed strict build must not leave a cache entry"


def test_strict_on_a_lenient_cache_still_raises(tokenizer, mixed_file, tmp_path):
    build([mixed_file], tokenizer, tmp_path / "cache")
    with pytest.raises(BadRow, match=f"{mixed_file}:4: bad row: invalid_json"):
        build([mixed_file], tokenizer, tmp_path / "cache", strict=True)


def test_rerun_reuses_the_cache_without_tokenising(tokenizer, mixed_file, tmp_path, monkeypatch):
    first, summary = build([mixed_file], tokenizer, tmp_path / "cache")
    assert not summary.from_cache
    calls = []
    monkeypatch.setattr(token_shards.ConversationRenderer, "render", lambda *a, **k: calls.append(1))
    second, cached = build([mixed_file], tokenizer, tmp_path / "cache")
    assert cached.from_cache and calls == [] and cached.cache_path == summary.cache_path
    assert second.to_dict() == first.to_dict()
    for name in ("kept", "skipped", "supervised_tokens", "total_tokens", "first_bad", "sources"):
        assert getattr(cached, name) == getattr(summary, name)
    assert "reused cache" in cached.format()
    assert sorted(os.listdir(tmp_path / "cache")) == [os.path.basename(summary.cache_path)]


def test_cache_key_changes_with_inputs(tokenizer, mixed_file, tmp_path):
    base = token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH, "train", None)
    assert base == token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH, "train", None)
    assert base != token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH + 1, "train", None)
    assert base != token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH, "train", {"enable_thinking": False})
    # A changed data.supervise_reasoning masks other tokens, so it must tokenise again.
    assert base == token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH, "train", None, True)
    assert base != token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH, "train", None, False)
    original = tokenizer.chat_template
    tokenizer.chat_template = original.replace("<|im_end|>\\n", "<|im_end|>")
    try:
        assert base != token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH, "train", None)
    finally:
        tokenizer.chat_template = original
    with open(mixed_file, "a") as handle:
        handle.write(json.dumps(GOOD[0]) + "\n")
    assert base != token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH, "train", None)


def test_tokenizer_vocabulary_is_part_of_the_key(tokenizer, mixed_file, tmp_path):
    other = build_chat_tokenizer(tmp_path / "other_tokenizer", vocab_size=300)
    assert token_shards.cache_key([str(mixed_file)], tokenizer, MAX_LENGTH, "train", None) != token_shards.cache_key(
        [str(mixed_file)], other, MAX_LENGTH, "train", None
    )


def test_several_formats_and_large_builds_split_into_shards(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(token_shards, "SHARD_ROWS", 2)
    jsonl = tmp_path / "a.jsonl"
    write_conversations_jsonl(jsonl, [GOOD[0], GOOD[2]])
    parquet = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD[1]]), parquet)
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([GOOD[0]]).save_to_disk(str(saved))
    dataset, summary = build([jsonl, parquet, saved], tokenizer, tmp_path / "cache")
    assert summary.kept == 4 and summary.skipped == {}
    assert dataset["sample_id"] == [0, 1, 2, 3]
    assert len(list((tmp_path / "cache").glob("*/shard-*.arrow"))) == 2
    assert dataset[3]["input_ids"] == dataset[0]["input_ids"]


def test_empty_result_still_loads(tokenizer, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("{nope\n")
    dataset, summary = build([path], tokenizer, tmp_path / "cache")
    assert len(dataset) == 0 and summary.kept == 0 and summary.skipped == {"invalid_json": 1}
    assert dataset.column_names == ["input_ids", "loss_mask", "sample_id", "length"]


def test_worker_processes_give_the_same_result(tokenizer, mixed_file, tmp_path):
    # One spawned pool only: each worker imports transformers, which dominates this test's time.
    serial, serial_summary = build([mixed_file], tokenizer, tmp_path / "serial")
    parallel, parallel_summary = build([mixed_file], tokenizer, tmp_path / "parallel", num_workers=2)
    assert parallel.to_dict() == serial.to_dict()
    assert parallel_summary.skipped == serial_summary.skipped
    assert parallel_summary.first_bad == serial_summary.first_bad


def test_row_the_template_cannot_render_prefix_stably_is_skipped(tmp_path, tokenizer):
    rows = [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>x</think>Hello"}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset, summary = build([path], tokenizer, tmp_path / "cache", chat_template_kwargs={"enable_thinking": False})
    assert len(dataset) == 1 and summary.skipped == {"template_mismatch": 1}
    with pytest.raises(BadRow, match="rows.jsonl:1"):
        build([path], tokenizer, tmp_path / "cache2", strict=True, chat_template_kwargs={"enable_thinking": False})
