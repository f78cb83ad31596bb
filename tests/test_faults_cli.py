"""Fault matrix, commands: the shared user-error report, ``deepspec regenerate`` (input = output, malformed
responses, endpoint URLs) and ``deepspec eval`` on an empty suite.

Regeneration talks to real HTTP servers on 127.0.0.1 (the scripted ones of ``tests/helpers/regeneration.py``,
which send malformed 200 responses on cue). The eval probes pass paths where no model exists: the refusal has to
come before anything loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepspec_train.commands.dispatch import main
from deepspec_train.common.errors import UserError, exit_on_user_error, one_line
from deepspec_train.regenerate.backend import GenerationError
from deepspec_train.regenerate.http_backend import OpenAIChatBackend
from tests.helpers.regeneration import SAMPLING, write_jsonl

HI = [{"role": "user", "content": "hi"}]


def only_error_line(capsys: pytest.CaptureFixture) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# ----------------------------------------------------------------------------------------- the mechanism


def test_user_errors_print_one_line_and_exit_2(capsys, monkeypatch) -> None:
    monkeypatch.delenv("DEEPSPEC_DEBUG", raising=False)

    def fail() -> int:
        raise UserError("first\n  second\n")

    assert exit_on_user_error(fail) == 2
    assert capsys.readouterr().err == "error: first; second\n"
    monkeypatch.setenv("DEEPSPEC_DEBUG", "1")
    assert exit_on_user_error(fail) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("error: first; second\n")
    assert exit_on_user_error(lambda: None) == 0 and exit_on_user_error(lambda: 1) == 1
    with pytest.raises(ZeroDivisionError):
        exit_on_user_error(lambda: 1 // 0)
    assert one_line("a\n\nb") == "a; b"


def test_a_bad_recipe_value_exits_2_through_the_console_script(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deepspec_train.commands.dispatch", "train", "recipe=tiny-dspark", "train.lr=fast"],
        capture_output=True, text=True, timeout=120, env=os.environ | {"DEEPSPEC_DEBUG": "0"},
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: override: 'train.lr' must be a number")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ----------------------------------------------------------------------------------------------- regenerate


def regenerate(input_path: str, output_path: str, *endpoint: str) -> int:
    endpoints = [arg for url in endpoint or ("http://127.0.0.1:9",) for arg in ("--endpoint", url)]
    return main(["regenerate", "--input", input_path, "--out", output_path, "--backend", "http", "--model", "m",
                 *endpoints, "--retries", "0", "--no-progress"])


def test_regenerate_refuses_to_write_its_own_input(tmp_path, capsys, monkeypatch) -> None:
    source = write_jsonl(tmp_path / "prompts.jsonl", [{"id": 1, "messages": HI}])
    before = Path(source).read_bytes()
    os.symlink(source, tmp_path / "link.jsonl")
    monkeypatch.chdir(tmp_path)
    for output in (source, "prompts.jsonl", "./sub/../prompts.jsonl", str(tmp_path / "link.jsonl")):
        assert regenerate(source, output) == 2
        assert f"--out {output} is the input file" in only_error_line(capsys)
    assert Path(source).read_bytes() == before
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "part.jsonl", [{"id": 1, "messages": HI}])
    assert regenerate(str(tmp_path / "data"), str(tmp_path / "data" / "regen.jsonl")) == 2
    assert "lies inside the input directory" in only_error_line(capsys)
    assert not (tmp_path / "data" / "regen.jsonl").exists()


def test_a_malformed_200_response_is_retried_like_a_server_error(scripted) -> None:
    cut_off = json.dumps({"choices": [{"message": {"content": "never"}}]}).encode()[:20]
    server = scripted([cut_off, b"<html>proxy error</html>", b'{"choices": []}'])
    backend = OpenAIChatBackend([server.url], "m", retries=3, timeout_s=10, backoff_s=0.001)
    assert backend.complete(HI, SAMPLING) == "fine" and len(server.bodies) == 4
    # Bounded by the same retries: a server that keeps answering garbage fails the row, it does not loop.
    always = scripted([b"garbage"] * 10)
    with pytest.raises(GenerationError) as caught:
        OpenAIChatBackend([always.url], "m", retries=2, timeout_s=10, backoff_s=0.001).complete(HI, SAMPLING)
    assert caught.value.reason == "bad response" and len(always.bodies) == 3


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("localhost:8000", "needs the scheme http:// or https://"),
        ("127.0.0.1:8000", "needs the scheme http:// or https://"),
        ("ftp://host:21", "needs the scheme http:// or https://"),
        ("http://", "names no host"),
        ("http://:8000/v1", "names no host"),
        ("http://host:99999", "has an invalid port (Port out of range 0-65535)"),
    ],
)
def test_an_endpoint_that_is_not_an_http_url_fails_before_any_request(tmp_path, capsys, endpoint, problem) -> None:
    source = write_jsonl(tmp_path / "prompts.jsonl", [{"id": 1, "messages": HI}])
    assert regenerate(source, str(tmp_path / "out.jsonl"), "http://127.0.0.1:9", endpoint) == 2
    assert only_error_line(capsys) == f"error: endpoint {endpoint!r} {problem}; expected e.g. http://localhost:8000"
    assert not (tmp_path / "out.jsonl").exists()


# ----------------------------------------------------------------------------------------------------- eval


def evaluate(tmp_path: Path, suite: Path, *extra: str) -> int:
    return main(["eval", "--target", str(tmp_path / "no-target"), "--drafter", str(tmp_path / "no-drafter"),
                 "--suite", str(suite), "--out", str(tmp_path / "results.json"), "--no-progress", *extra])


def test_eval_refuses_an_empty_suite(tmp_path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert evaluate(tmp_path, empty) == 2
    assert only_error_line(capsys) == f"error: suite file {empty} holds no prompts: nothing to evaluate"
    suite = tmp_path / "one.jsonl"
    suite.write_text(json.dumps({"id": 1, "turns": ["hi"]}) + "\n")
    assert evaluate(tmp_path, suite, "--max-prompts", "0") == 2
    assert "--max-prompts must be at least 1, got 0" in only_error_line(capsys)
    assert not (tmp_path / "results.json").exists()


def test_eval_names_the_line_of_a_suite_that_is_not_json(tmp_path, capsys) -> None:
    suite = tmp_path / "bad.jsonl"
    suite.write_bytes(json.dumps({"id": 1, "turns": ["hi"]}).encode() + b"\n{\"id\": 2, \"turns\": [\"caf\xe9\"]}\n")
    assert evaluate(tmp_path, suite) == 2
    assert only_error_line(capsys).startswith(f"error: {suite}:2: not a JSON line")
