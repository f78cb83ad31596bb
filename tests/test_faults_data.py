"""Fault matrix, data bytes: bytes that are not UTF-8, files that are missing, empty or not data, strict mode,
and a token cache that must not go stale.

Rows go through the real readers and the real token-shard builder with a real BPE chat tokenizer; the
command-line probes run training's entry point (``train.py``'s ``main``) on the tiny random world, in this
process for the one-line messages and as a subprocess for the exit status and ``DEEPSPEC_DEBUG``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deepspec_train.data import token_shards
from deepspec_train.data.conversations import BadRow, DataSourceError, iter_records, read_conversations_jsonl
from deepspec_train.commands.train_entry import main as train_main
from tests.helpers.chat_tokenizer import build_chat_tokenizer
from tests.helpers.streaming_world import REPO, rank_env, recipe_overrides

ROW = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello, how are you?"}]}
LINE = json.dumps(ROW).encode()
# A Latin-1 e-acute inside the answer: valid JSON structure, invalid UTF-8.
NOT_UTF8 = LINE.replace(b"Hello", b"H\xe9llo")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_chat_tokenizer(tmp_path_factory.mktemp("chat_tokenizer"))


def build(sources, tokenizer, cache, **kwargs):
    renderer = token_shards.ConversationRenderer(tokenizer, 128, None)
    return token_shards.build_token_dataset([str(s) for s in sources], renderer, str(cache), progress=False, **kwargs)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_line_that_is_not_utf8_is_a_counted_bad_row(tokenizer, tmp_path) -> None:
    path = write(tmp_path / "chat.jsonl", b"\n".join([LINE, NOT_UTF8, LINE]) + b"\n")
    dataset, summary = build([path], tokenizer, tmp_path / "cache")
    assert len(dataset) == 2 and summary.skipped == {"invalid_encoding": 1}
    offset = NOT_UTF8.index(b"\xe9")
    assert summary.first_bad == {"reason": "invalid_encoding", "where": f"{path}:2",
                                 "detail": f"byte 0xe9 at offset {offset} is not UTF-8"}
    with pytest.raises(BadRow) as caught:
        build([path], tokenizer, tmp_path / "strict", strict=True)
    assert caught.value.reason == "invalid_encoding" and caught.value.where == f"{path}:2"
    with pytest.raises(BadRow, match=f"{path}:2: bad row: invalid_encoding"):
        read_conversations_jsonl(path)


def test_a_json_array_that_is_not_utf8_is_one_bad_row_at_its_line(tmp_path) -> None:
    path = write(tmp_path / "chat.json", b"[\n" + LINE + b",\n" + NOT_UTF8 + b"\n]\n")
    ((where, bad),) = list(iter_records(str(path)))
    assert isinstance(bad, BadRow) and bad.reason == "invalid_encoding" and where == bad.where == f"{path}:3"


def test_a_utf8_byte_order_mark_is_not_a_bad_row(tmp_path) -> None:
    for name, data in (("lines.jsonl", b"\xef\xbb\xbf" + LINE + b"\n"), ("array.json", b"\xef\xbb\xbf[" + LINE + b"]")):
        assert [record for _, record in iter_records(str(write(tmp_path / name, data)))] == [ROW]


def test_the_cache_key_follows_the_content_even_with_size_and_mtime_kept(tokenizer, tmp_path) -> None:
    path = write(tmp_path / "chat.jsonl", LINE + b"\n")
    before = os.stat(path)
    key = token_shards.cache_key([str(path)], tokenizer, 128, "train", None)
    # Same length, other bytes, the modification time put back (what rsync -t or a careless tool does).
    write(path, LINE.replace(b"Hello", b"Howdy") + b"\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert token_shards.cache_key([str(path)], tokenizer, 128, "train", None) != key
    first, _ = build([path], tokenizer, tmp_path / "cache")
    write(path, LINE + b"\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    second, summary = build([path], tokenizer, tmp_path / "cache")
    assert not summary.from_cache and first["input_ids"] != second["input_ids"]


SOURCE_FAULTS = {
    "missing": (lambda d: d / "missing.jsonl", "no such file or directory"),
    "empty": (lambda d: write(d / "empty.jsonl", b""), "is empty: it holds no rows"),
    "blank lines only": (lambda d: write(d / "blank.jsonl", b"\n \n"), "is empty: it holds no rows"),
    "empty array": (lambda d: write(d / "empty.json", b"[]"), "is empty: it holds no rows"),
    "unsupported": (lambda d: write(d / "chat.csv", b"a,b\n"), "unsupported file type '.csv'"),
    "text named parquet": (lambda d: write(d / "chat.parquet", b"hello\n"), "not a readable Parquet file"),
    "text named arrow": (lambda d: write(d / "chat.arrow", b"hello world\n" * 4), "not a readable Arrow file"),
    "empty parquet": (lambda d: pq.write_table(pa.table({"messages": pa.array([], pa.string())}), d / "e.parquet")
                      or d / "e.parquet", "is empty: it holds no rows"),
}


@pytest.mark.parametrize("fault", sorted(SOURCE_FAULTS))
def test_a_source_without_rows_fails_with_one_line_naming_it(tokenizer, tmp_path, fault) -> None:
    make, expected = SOURCE_FAULTS[fault]
    path = make(tmp_path)
    with pytest.raises(DataSourceError) as caught:
        build([path], tokenizer, tmp_path / "cache")
    message = str(caught.value)
    assert str(path) in message and expected in message and "\n" not in message, message
    assert not any((tmp_path / "cache").iterdir()), "a failed build leaves no cache entry"


# ---------------------------------------------------------------------------------------------- train.py


def train_args(world: dict, tmp_path: Path, data: Path, **extra) -> list[str]:
    return recipe_overrides(world, tmp_path / "run", **{"data.train": f"[{data}]", "data.validation": "[]",
                                                        "data.cache_dir": str(tmp_path / "cache"), **extra})


def first_good_lines(world: dict, count: int) -> list[bytes]:
    return Path(world["train"]).read_bytes().splitlines()[:count]


TRAIN_FAULTS = {
    "strict bad json": (lambda d, good: write(d / "s.jsonl", b"\n".join([good[0], b"{oops", good[1]])),
                        True, ":2: bad row: invalid_json"),
    "strict not utf8": (lambda d, good: write(d / "u.jsonl", b"\n".join([good[0], good[1][:40] + b"\xff" + good[1][40:]])),
                        True, ":2: bad row: invalid_encoding (byte 0xff at offset 40 is not UTF-8)"),
    "missing": (lambda d, good: d / "nowhere.jsonl", False, "nowhere.jsonl': no such file or directory"),
    "empty": (lambda d, good: write(d / "empty.jsonl", b""), False, "empty.jsonl is empty: it holds no rows"),
    "not data": (lambda d, good: write(d / "notes.parquet", b"hello\n"), False, "notes.parquet: not a readable Parquet"),
    "unsupported": (lambda d, good: write(d / "chat.csv", b"a,b\n"), False, "unsupported file type '.csv'"),
}


@pytest.mark.parametrize("fault", sorted(TRAIN_FAULTS))
def test_training_reports_a_data_fault_as_one_line_and_status_2(streaming_world, tmp_path, capsys, fault) -> None:
    make, strict, expected = TRAIN_FAULTS[fault]
    path = make(tmp_path, first_good_lines(streaming_world, 2))
    status = train_main(train_args(streaming_world, tmp_path, path, **{"data.strict": str(strict).lower()}))
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(err_lines) == 1, err_lines
    assert str(path) in err_lines[0] and expected in err_lines[0], err_lines


@pytest.mark.slow
def test_train_py_exit_status_and_debug_traceback(streaming_world, tmp_path) -> None:
    args = ["train.py", *train_args(streaming_world, tmp_path, tmp_path / "nowhere.jsonl")]
    env = rank_env(0, 1, 0) | {"WORLD_SIZE": "1"}
    quiet = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr, quiet.stderr
    assert quiet.stderr.strip().splitlines()[-1].startswith(f"error: data source '{tmp_path / 'nowhere.jsonl'}'")
    debug = subprocess.run([sys.executable, *args], cwd=REPO, env=env | {"DEEPSPEC_DEBUG": "1"}, capture_output=True,
                           text=True, timeout=120)
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "DataSourceError" in debug.stderr, debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == quiet.stderr.strip().splitlines()[-1]
