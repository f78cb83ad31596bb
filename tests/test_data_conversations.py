"""Tests of the conversation readers (JSONL, JSON arrays, Parquet, Arrow, datasets) and normalisation."""

from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deepspec_train.data import conversations
from deepspec_train.data.conversations import (
    BadRow,
    DataSourceError,
    iter_records,
    normalize_conversation,
    read_conversations_jsonl,
    write_conversations_jsonl,
)

ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
    {"id": "b", "messages": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]},
]


def records(source, split="train"):
    return [(where, record) for where, record in iter_records(str(source), split)]


def test_jsonl_lines_are_located_by_one_based_line(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n[1, 2]\n" + json.dumps(ROWS[1]) + "\n")
    got = records(path)
    assert [where for where, _ in got] == [f"{path}:1", f"{path}:3", f"{path}:4", f"{path}:5"]
    assert got[0][1] == ROWS[0] and got[3][1] == ROWS[1]
    for where, bad in got[1:3]:
        assert isinstance(bad, BadRow) and bad.reason == "invalid_json" and bad.where == where


def test_json_array_file(tmp_path):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(ROWS, indent=2))
    assert records(path) == [(f"{path}:0", ROWS[0]), (f"{path}:1", ROWS[1])]


def test_parquet_and_arrow_files(tmp_path):
    table = pa.Table.from_pylist(ROWS)
    parquet = tmp_path / "chat.parquet"
    pq.write_table(table, parquet)
    arrow_file = tmp_path / "file.arrow"
    with pa.OSFile(str(arrow_file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    arrow_stream = tmp_path / "stream.arrow"
    with pa.OSFile(str(arrow_stream), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    for path in (parquet, arrow_file, arrow_stream):
        assert records(path) == [(f"{path}:0", ROWS[0]), (f"{path}:1", ROWS[1])]


def test_saved_dataset_directory_and_split(tmp_path):
    dataset = datasets.Dataset.from_list(ROWS)
    dataset.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": dataset, "test": dataset.select([1])}).save_to_disk(str(tmp_path / "dict"))
    assert [r for _, r in records(tmp_path / "single")] == ROWS
    assert records(tmp_path / "dict", split="test") == [(f"{tmp_path / 'dict'}:0", ROWS[1])]
    with pytest.raises(DataSourceError, match="no split 'validation'"):
        records(tmp_path / "dict", split="validation")


def test_directory_and_glob_of_data_files(tmp_path):
    write_conversations_jsonl(tmp_path / "part-1.jsonl", ROWS[:1])
    write_conversations_jsonl(tmp_path / "part-2.jsonl", ROWS[1:])
    assert [r for _, r in records(tmp_path)] == ROWS
    assert [r for _, r in records(tmp_path / "part-*.jsonl")] == ROWS
    with pytest.raises(DataSourceError, match="matches no file"):
        records(tmp_path / "nothing-*.jsonl")


def test_other_sources_go_through_load_dataset(tmp_path, monkeypatch):
    import gzip

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    directory = tmp_path / "compressed"
    directory.mkdir()
    with gzip.open(directory / "train.jsonl.gz", "wt") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in ROWS)
    assert [r for _, r in records(directory)] == ROWS


def test_unreachable_hub_name_gives_a_clear_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'org/chat' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataSourceError, match="not a local file or directory.*network access"):
        records("org/chat")


def test_unsupported_file_type(tmp_path):
    path = tmp_path / "chat.csv"
    path.write_text("a,b\n")
    with pytest.raises(DataSourceError, match="unsupported file type"):
        records(path)


def test_normalize_openai_sharegpt_and_text_parts():
    expected = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
    ]
    sharegpt = {
        "conversations": [
            {"from": "system", "value": "S"},
            {"from": "human", "value": "U"},
            {"from": "gpt", "value": "A"},
        ]
    }
    for user, assistant in (("human", "gpt"), ("user", "assistant"), ("Human", "chatgpt")):
        sharegpt["conversations"][1]["from"], sharegpt["conversations"][2]["from"] = user, assistant
        assert normalize_conversation(sharegpt, "x:1") == expected
    openai = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "U"}]},
            {"role": "assistant", "content": "A", "name": "bot"},
        ]
    }
    assert normalize_conversation(openai, "x:1") == expected


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"text": "no conversation"}, "missing_field"),
        ({"messages": [{"role": "user"}]}, "missing_field"),
        ({"messages": [{"role": "user", "content": None}]}, "missing_field"),
        ({"messages": [{"content": "hi"}]}, "missing_field"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, "missing_field"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "unknown_role"),
        ({"conversations": [{"from": "bing", "value": "hi"}]}, "unknown_role"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " \n"}]}, "empty_assistant"),
    ],
)
def test_normalize_bad_rows(record, reason):
    with pytest.raises(BadRow) as error:
        normalize_conversation(record, "data.jsonl:7")
    assert error.value.reason == reason and error.value.where == "data.jsonl:7"
    assert str(error.value).startswith("data.jsonl:7: bad row: " + reason)


def test_bad_row_rejects_unknown_reasons():
    with pytest.raises(ValueError, match="unknown bad-row reason"):
        BadRow("weird")


def test_write_read_roundtrip_keeps_extra_keys_and_converts_sharegpt(tmp_path):
    rows = [dict(ROWS[0], category="greeting"), ROWS[1]]
    path = tmp_path / "out" / "chat.jsonl"
    write_conversations_jsonl(path, rows)
    assert read_conversations_jsonl(path) == rows
    sharegpt = tmp_path / "sharegpt.jsonl"
    turns = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]
    sharegpt.write_text(json.dumps({"id": 3, "conversations": turns}) + "\n")
    assert read_conversations_jsonl(sharegpt) == [
        {"id": 3, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    ]
    with pytest.raises(TypeError, match="without a 'messages' list"):
        write_conversations_jsonl(tmp_path / "bad.jsonl", [{"conversations": []}])
    assert not (tmp_path / "bad.jsonl").exists()


def test_read_conversations_jsonl_raises_on_invalid_json(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    with pytest.raises(BadRow, match=f"{path}:2: bad row: invalid_json"):
        read_conversations_jsonl(path)


def test_module_lists_every_reason():
    assert set(conversations.BAD_ROW_REASONS) == {
        "invalid_encoding",
        "invalid_json",
        "missing_field",
        "unknown_role",
        "empty_assistant",
        "nothing_to_supervise",
        "template_mismatch",
        "too_long",
        "malformed_reasoning",
        "reasoning_not_rendered",
    }
