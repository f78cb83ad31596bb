"""``deepspec data check``: the report a user reads before a run, from a tokenizer alone (the target folder
here holds no weights), in words and as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepspec_train.commands.dispatch import main
from tests.helpers.chat_tokenizer import build_chat_tokenizer

ROWS = [{"question": "What is two plus three?", "answer": "Two plus three is five."}] * 5 + [
    {"question": "Say it at length.", "answer": "five " * 200},
    {"question": "An empty answer.", "answer": ""},
]


@pytest.fixture(scope="module")
def tokenizer_only(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer_only")
    build_chat_tokenizer(directory)
    assert not list(directory.glob("*.safetensors"))
    return directory


def check(capsys, *args: str) -> tuple[int, str]:
    status = main(["data", "check", *args])
    return status, capsys.readouterr().out


def test_the_json_report_says_what_a_run_would_use(tokenizer_only, tmp_path, capsys) -> None:
    source = tmp_path / "qa.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    status, out = check(capsys, str(source), "--target", str(tokenizer_only), "--max-length", "64", "--json")
    report = json.loads(out)
    (only,) = report["sources"]
    assert status == 0 and only["shape"] == "question_answer" and only["detected"]
    assert (only["rows_read"], only["kept"], only["skipped"]) == (7, 5, {"empty_assistant": 1, "too_long": 1})
    assert only["first_bad"]["where"] == f"{source}:6" and not only["refused_by_a_run"]
    assert report["kept"] == 5 and 0 < report["supervised_tokens"] < report["tokens"]
    assert report["lengths"]["max_length"] == 64 and report["lengths"]["too_long_skipped"] == 1
    assert report["lengths"]["min"] == report["lengths"]["max"] == report["tokens"] // 5
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\n[[Two plus three is five.<|im_end|>]]" in report["example"]


def test_the_words_report_names_a_source_a_run_would_refuse(tokenizer_only, tmp_path, capsys) -> None:
    source = tmp_path / "renamed.jsonl"
    source.write_text(json.dumps({"query": "Hi", "reply": "Hello!"}) + "\n")
    status, out = check(capsys, str(source), "--target", str(tokenizer_only))
    assert status == 0 and "1 rows read as no known row shape (data.format=auto), 0 kept" in out
    assert "a run would refuse it" in out
    status, out = check(capsys, str(source), "--target", str(tokenizer_only), "--field", "prompt=query",
                        "--field", "completion=reply")
    assert "read as prompt_completion (data.format=auto), 1 kept" in out and "usable" in out
    assert "[[Hello!<|im_end|>]]" in out
