"""Tests for regeneration: the local backend, the OpenAI-compatible server and client, and the resumable runner.

The HTTP tests run the real ``openai_server`` over a tiny random-weight Qwen3 model on 127.0.0.1; retry and
round-robin tests use small scripted servers that fail on purpose. Expected answers are computed by asking the
served model directly, so a sampling parameter lost on the way through HTTP shows up as a different answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from deepspec_train.regenerate.settings import RegenerateConfig
from deepspec_train.regenerate import cli
from deepspec_train.regenerate.backend import GenerationError
from deepspec_train.regenerate.http_backend import OpenAIChatBackend, chat_completions_url, parse_answer
from deepspec_train.regenerate.local_backend import LocalBackend
from deepspec_train.regenerate.openai_server import serve
from deepspec_train.regenerate.runner import plan_turns, read_finished_ids, regenerate_file
from deepspec_train.regenerate.sampling import SamplingParams
from tests.helpers.regeneration import SAMPLING, write_jsonl
from tests.helpers.tiny_chat_model import save_tiny_chat_model

PROMPT_ROWS = [
    {
        "id": "a",
        "category": "math",
        "messages": [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "old answer"}],
    },
    {
        "id": "b",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": "old"},
        ],
    },
    {"conversations": [{"from": "human", "value": "Write a function."}, {"from": "gpt", "value": "old"}]},
    {"id": "d", "messages": [{"role": "user", "content": "A prompt with no answer yet"}]},
    {
        "id": "e",
        "category": "code",
        "messages": [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "old"}],
    },
    {"id": "f", "messages": [{"role": "user", "content": "The quick brown fox"}]},
]


REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny_chat_model"))


@pytest.fixture(scope="module")
def server(model_dir: str):
    server, thread = serve(model_dir, host="127.0.0.1", port=0)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def read_jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def served_answer(server, messages: list[dict], sampling: SamplingParams = SAMPLING) -> str:
    return server.backend.generate([messages], sampling)[0]


def http_backend(server, concurrency: int = 3) -> OpenAIChatBackend:
    return OpenAIChatBackend([server.url], server.model_name, concurrency=concurrency, retries=0, timeout_s=30)


# ---------------------------------------------------------------------------------------------- local backend


def test_local_backend_batched_greedy_matches_one_at_a_time(model_dir: str) -> None:
    backend = LocalBackend(model_dir, batch_size=3)
    conversations = [[{"role": "user", "content": "hi " * n}] for n in range(1, 6)]
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    batched = backend.generate(conversations, greedy)
    # Left padding must not change what the model says: a padded batch equals each prompt on its own.
    assert batched == [backend.generate([c], greedy)[0] for c in conversations]
    assert len(set(batched)) > 1


def test_local_backend_sampling_is_deterministic_for_a_seed(model_dir: str) -> None:
    conversations = [[{"role": "user", "content": f"question {n}"}] for n in range(5)]
    first = LocalBackend(model_dir, batch_size=2, seed=3).generate(conversations, SAMPLING)
    again = LocalBackend(model_dir, batch_size=2, seed=3).generate(conversations, SAMPLING)
    other = LocalBackend(model_dir, batch_size=2, seed=4).generate(conversations, SAMPLING)
    assert len(first) == 5 and all(isinstance(a, str) and a for a in first)
    assert first == again
    assert first != other


def test_local_backend_stops_at_end_of_turn(model_dir: str) -> None:
    backend = LocalBackend(model_dir, batch_size=2)
    conversation = [{"role": "user", "content": "stop here"}]
    greedy = SamplingParams(temperature=0, max_new_tokens=4)
    prompt = backend.tokenizer(backend.render_prompt(conversation, greedy), return_tensors="pt")
    first_token = int(backend.model.generate(**prompt, max_new_tokens=1, do_sample=False)[0, -1])
    # Declare the model's first greedy token an end-of-turn token: the answer must end before it.
    backend.eos_token_ids = [first_token]
    completion = backend.complete([conversation], greedy)[0]
    assert (completion.text, completion.finish_reason, completion.completion_tokens) == ("", "stop", 1)
    assert backend.render_prompt(conversation, greedy).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


class CrashAfterAnswers:
    """Delegates to a streaming backend and raises (as a killed process would stop) after ``answers`` answers."""

    def __init__(self, inner: LocalBackend, answers: int) -> None:
        self.inner, self.answers = inner, answers
        self.max_in_flight, self.batched = inner.max_in_flight, inner.batched

    def generate(self, conversations, sampling):
        return self.inner.generate(conversations, sampling)

    def stream(self, next_request, sampling, on_step=None):
        for count, answered in enumerate(self.inner.stream(next_request, sampling, on_step)):
            if count == self.answers:
                raise RuntimeError("simulated crash")
            yield answered


def test_local_resume_writes_what_an_uninterrupted_run_writes(model_dir: str, tmp_path: Path) -> None:
    """Each answer's random stream is its own (seed, row id, turn, prompt): a run cut short and resumed with other
    batch sizes writes the same answers as one run."""
    source = write_jsonl(tmp_path / "prompts.jsonl", PROMPT_ROWS)
    whole, resumed = str(tmp_path / "whole.jsonl"), str(tmp_path / "resumed.jsonl")
    regenerate_file(source, whole, LocalBackend(model_dir, batch_size=2, seed=5), SAMPLING, progress=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        regenerate_file(source, resumed, CrashAfterAnswers(LocalBackend(model_dir, batch_size=3, seed=5), 2), SAMPLING,
                        progress=False)
    assert len(read_jsonl(resumed)) == 2
    summary = regenerate_file(source, resumed, LocalBackend(model_dir, batch_size=4, seed=5), SAMPLING, progress=False)
    assert (summary.done, summary.skipped) == (4, 2)
    by_id = {str(row["id"]): row for row in read_jsonl(whole)}
    assert {str(row["id"]): row for row in read_jsonl(resumed)} == by_id and len(by_id) == 6
    other_seed = str(tmp_path / "other_seed.jsonl")
    regenerate_file(source, other_seed, LocalBackend(model_dir, batch_size=2, seed=6), SAMPLING, progress=False)
    assert {str(row["id"]): row for row in read_jsonl(other_seed)} != by_id


def test_local_multi_turn_all_answers_each_turn_after_its_own_answers(model_dir: str, tmp_path: Path) -> None:
    rows = [
        {"id": "two", "messages": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "x"},
                                   {"role": "user", "content": "u2"}, {"role": "assistant", "content": "y"}]},
        {"id": "one", "messages": [{"role": "user", "content": "w1"}]},
        {"id": "three", "messages": [{"role": "user", "content": "v1"}, {"role": "assistant", "content": "x"},
                                     {"role": "user", "content": "v2"}, {"role": "assistant", "content": "y"},
                                     {"role": "user", "content": "v3"}]},
    ]
    source = write_jsonl(tmp_path / "prompts.jsonl", rows)
    greedy = SamplingParams(temperature=0, max_new_tokens=5)
    backend = LocalBackend(model_dir, batch_size=2)
    summary = regenerate_file(source, str(tmp_path / "all.jsonl"), backend, greedy, progress=False, multi_turn="all")
    assert summary.done == 3
    out = {row["id"]: row["messages"] for row in read_jsonl(str(tmp_path / "all.jsonl"))}
    assert [len(out[key]) for key in ("two", "one", "three")] == [4, 2, 6]
    for messages in out.values():
        for turn in range(1, len(messages), 2):
            assert messages[turn]["content"] == backend.generate([messages[:turn]], greedy)[0]


# ------------------------------------------------------------------------------------------------ HTTP path


def test_http_regeneration_replaces_every_answer(server, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "prompts.jsonl", PROMPT_ROWS)
    output = str(tmp_path / "out" / "regen.jsonl")
    summary = regenerate_file(source, output, http_backend(server, concurrency=3), SAMPLING, progress=False)
    assert (summary.done, summary.skipped, summary.failed) == (6, 0, 0)
    rows = {str(row["id"]): row for row in read_jsonl(output)}
    # The ShareGPT row has no id: it is named by its row index.
    assert sorted(rows) == ["2", "a", "b", "d", "e", "f"]
    assert rows["a"]["category"] == "math" and rows["e"]["category"] == "code" and "category" not in rows["b"]
    for row in rows.values():
        prompt, answer = row["messages"][:-1], row["messages"][-1]
        assert answer["role"] == "assistant"
        assert answer["content"] == served_answer(server, prompt)
        assert all(m["content"] not in ("old", "old answer") for m in row["messages"])
    assert rows["b"]["messages"][0] == {"role": "system", "content": "Be brief."}


def test_server_models_route_and_request_errors(server) -> None:
    import urllib.error
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    listing = json.loads(direct.open(f"{server.url}/v1/models", timeout=10).read())
    assert listing["data"][0]["id"] == server.model_name
    for body, status in [
        ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, 400),
        ({"messages": [{"role": "tool", "content": "x"}]}, 400),
    ]:
        request = urllib.request.Request(f"{server.url}/v1/chat/completions", data=json.dumps(body).encode())
        with pytest.raises(urllib.error.HTTPError) as caught:
            direct.open(request, timeout=10)
        assert caught.value.code == status


class CrashAfter:
    """Delegates to a backend and raises (as a killed process would stop) once ``calls`` calls have started."""

    def __init__(self, inner: OpenAIChatBackend, calls: int) -> None:
        self.inner, self.calls_left = inner, calls
        self.max_in_flight, self.batched = inner.max_in_flight, inner.batched
        self.lock = threading.Lock()

    def generate(self, conversations, sampling):
        with self.lock:
            self.calls_left -= 1
            crash = self.calls_left < 0
        if crash:
            raise RuntimeError("simulated crash")
        return self.inner.generate(conversations, sampling)


def test_resume_skips_finished_rows_and_drops_a_half_written_line(server, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "prompts.jsonl", PROMPT_ROWS)
    output = str(tmp_path / "regen.jsonl")
    with pytest.raises(RuntimeError, match="simulated crash"):
        regenerate_file(source, output, CrashAfter(http_backend(server, concurrency=1), 3), SAMPLING, progress=False)
    first_run = Path(output).read_text()
    finished = [row["id"] for row in read_jsonl(output)]
    assert finished == ["a", "b", 2]
    # A crash in the middle of a write leaves a line without its newline; it must not count as done.
    with open(output, "a") as handle:
        handle.write('{"id": "d", "messages": [{"role": "user", "cont')
    assert read_finished_ids(output) == {"a", "b", "2"}
    assert Path(output).read_text() == first_run

    before = server.completions_served
    summary = regenerate_file(source, output, http_backend(server), SAMPLING, progress=False)
    assert (summary.done, summary.skipped, summary.failed) == (3, 3, 0)
    assert server.completions_served - before == 3
    assert Path(output).read_text().startswith(first_run)
    ids = [str(row["id"]) for row in read_jsonl(output)]
    assert sorted(ids) == ["2", "a", "b", "d", "e", "f"]

    summary = regenerate_file(source, output, http_backend(server), SAMPLING, progress=False)
    assert (summary.done, summary.skipped) == (0, 6)


class FailSome:
    """A batched backend that answers ``ok:<last user turn>`` but fails conversations containing ``fail``."""

    batched = True
    max_in_flight = 4

    def __init__(self) -> None:
        self.calls: list[list[list[dict]]] = []

    def generate(self, conversations, sampling):
        self.calls.append([list(c) for c in conversations])
        return [
            GenerationError("HTTP 400", "prompt too long") if "fail" in c[-1]["content"] else f"ok:{c[-1]['content']}"
            for c in conversations
        ]


def test_failed_rows_are_counted_not_written_and_retried(tmp_path: Path) -> None:
    rows = [
        {"id": i, "messages": [{"role": "user", "content": f"fail {i}" if i in (1, 4) else f"q{i}"}]} for i in range(6)
    ]
    source = write_jsonl(tmp_path / "prompts.jsonl", rows + [{"id": 9, "messages": "not a list"}])
    output = str(tmp_path / "regen.jsonl")
    summary = regenerate_file(source, output, FailSome(), SAMPLING, progress=False)
    assert (summary.done, summary.failed) == (4, 2)
    assert summary.failure_reasons == {"HTTP 400": 2} and summary.bad_rows == {"missing_field": 1}
    assert sorted(row["id"] for row in read_jsonl(output)) == [0, 2, 3, 5]
    backend = FailSome()
    summary = regenerate_file(source, output, backend, SAMPLING, progress=False)
    assert (summary.done, summary.skipped, summary.failed) == (0, 4, 2)
    assert [len(call) for call in backend.calls] == [2]


# --------------------------------------------------------------------------------------- retries, round-robin


def test_retry_after_503_goes_round_robin_over_endpoints(scripted) -> None:
    first, second = scripted([503], "from first"), scripted([503], "from second")
    backend = OpenAIChatBackend([first.url, second.url], "m", concurrency=2, retries=2, timeout_s=10, backoff_s=0.001)
    # Attempt 1 -> first (503), retry -> second (503), retry -> first (200).
    assert backend.complete([{"role": "user", "content": "hi"}], SAMPLING) == "from first"
    assert (len(first.bodies), len(second.bodies)) == (2, 1)
    # Round-robin continues: the next request goes to the second endpoint, which now answers.
    assert backend.complete([{"role": "user", "content": "hi"}], SAMPLING) == "from second"
    assert first.bodies[0] == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "max_tokens": 6,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_retry_limits_and_non_retryable_errors(scripted) -> None:
    busy = scripted([429, 500, 502, 503])
    backend = OpenAIChatBackend([busy.url], "m", retries=2, timeout_s=10, backoff_s=0.001)
    with pytest.raises(GenerationError) as caught:
        backend.complete([{"role": "user", "content": "hi"}], SAMPLING)
    assert caught.value.reason == "HTTP 502" and len(busy.bodies) == 3

    bad = scripted([400])
    results = OpenAIChatBackend([bad.url], "m", retries=3, backoff_s=0.001).generate(
        [[{"role": "user", "content": "x"}], [{"role": "user", "content": "y"}]], SAMPLING
    )
    # The two rows run concurrently: whichever reaches the server first gets the scripted 400.
    errors = [r for r in results if isinstance(r, GenerationError)]
    assert len(errors) == 1 and errors[0].reason == "HTTP 400"
    assert [r for r in results if not isinstance(r, GenerationError)] == ["fine"] and len(bad.bodies) == 2


def test_dead_endpoint_is_skipped_by_the_retry(scripted) -> None:
    dead = scripted([])
    dead_url = dead.url
    dead.stop()
    live = scripted([])
    backend = OpenAIChatBackend([dead_url, live.url], "m", retries=1, timeout_s=10, backoff_s=0.001)
    assert backend.complete([{"role": "user", "content": "hi"}], SAMPLING) == "fine"
    only_dead = OpenAIChatBackend([dead_url], "m", retries=1, timeout_s=10, backoff_s=0.001)
    with pytest.raises(GenerationError) as caught:
        only_dead.complete([{"role": "user", "content": "hi"}], SAMPLING)
    assert caught.value.reason == "connection error"


def test_endpoint_urls_and_reasoning_content() -> None:
    assert chat_completions_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"
    split = {"choices": [{"message": {"content": "42", "reasoning_content": "add them"}}]}
    assert parse_answer(json.dumps(split).encode()) == "<think>\nadd them\n</think>\n\n42"
    with pytest.raises(GenerationError, match="bad response"):
        parse_answer(b'{"choices": []}')


# ------------------------------------------------------------------------------------------------ multi-turn


def test_multi_turn_all_feeds_back_the_targets_own_answers(tmp_path: Path) -> None:
    rows = [
        {
            "id": "two",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "u1"},
                {"role": "assistant", "content": "orig1"},
                {"role": "user", "content": "u2"},
                {"role": "assistant", "content": "orig2"},
            ],
        },
        {
            "id": "open",
            "messages": [
                {"role": "user", "content": "v1"},
                {"role": "assistant", "content": "orig"},
                {"role": "user", "content": "v2"},
            ],
        },
        {"id": "one", "messages": [{"role": "user", "content": "w1"}]},
        {"id": "bad", "messages": [{"role": "assistant", "content": "no question"}]},
        {"id": "blank", "conversations": [{"from": "human", "value": "b1"}, {"from": "gpt", "value": " "}]},
    ]
    source = write_jsonl(tmp_path / "prompts.jsonl", rows)
    backend = FailSome()
    summary = regenerate_file(source, str(tmp_path / "all.jsonl"), backend, SAMPLING, progress=False, multi_turn="all")
    assert summary.done == 4 and summary.bad_rows == {"no_user_turn": 1}
    out = {row["id"]: row["messages"] for row in read_jsonl(str(tmp_path / "all.jsonl"))}
    assert out["two"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "ok:u1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "ok:u2"},
    ]
    assert [m["content"] for m in out["open"]] == ["v1", "ok:v1", "v2", "ok:v2"]
    # A blank answer in the prompt set is a slot to fill, not a bad row.
    assert [m["content"] for m in out["blank"]] == ["b1", "ok:b1"]
    # Turn by turn over the whole chunk: every row's first answer in one call, then the second answers, whose
    # prompts hold the regenerated first answers.
    assert [len(call) for call in backend.calls] == [4, 2]
    assert backend.calls[1][0][2] == {"role": "assistant", "content": "ok:u1"}

    summary = regenerate_file(source, str(tmp_path / "first.jsonl"), FailSome(), SAMPLING, progress=False)
    first = {row["id"]: row["messages"] for row in read_jsonl(str(tmp_path / "first.jsonl"))}
    assert [m["content"] for m in first["two"]] == ["sys", "u1", "ok:u1"]
    assert [m["content"] for m in first["open"]] == ["v1", "ok:v1"]


def test_plan_turns_marks_answers_to_generate() -> None:
    chat = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "x"}]
    assert [m["content"] for m in plan_turns(chat, "first")] == ["a", "b", None]
    assert [m["content"] for m in plan_turns(chat[:2], "all")] == ["a", "b", None]


# ------------------------------------------------------------------------------------------- recipe and CLI


def test_sampling_from_recipe_and_overrides() -> None:
    params = SamplingParams.from_recipe(RegenerateConfig())
    assert params == SamplingParams(temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=4096, enable_thinking=False)
    assert params.with_overrides(top_k=5, temperature=None).top_k == 5
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)


def test_cli_http_with_recipe(server, tmp_path: Path) -> None:
    recipe = tmp_path / "regen.yaml"
    recipe.write_text(f"regenerate:\n  temperature: 0.9\n  top_k: 5\n  endpoints: ['{server.url}']\n")
    source = write_jsonl(tmp_path / "prompts.jsonl", PROMPT_ROWS[:2])
    output = tmp_path / "regen.jsonl"
    argv = [
        "--input",
        source,
        "--out",
        str(output),
        "--backend",
        "http",
        "--model",
        server.model_name,
        "--recipe",
        str(recipe),
        "--max-new-tokens",
        "4",
        "--no-progress",
    ]
    assert cli.main(argv) == 0
    expected = SamplingParams(temperature=0.9, top_p=0.8, top_k=5, max_new_tokens=4)
    for row in read_jsonl(str(output)):
        assert row["messages"][-1]["content"] == served_answer(server, row["messages"][:-1], expected)
    assert cli.main(["--input", source, "--out", str(output), "--backend", "http", "--no-progress"]) == 2


def test_output_still_works_as_the_deprecated_spelling_of_out(server, tmp_path: Path) -> None:
    """Run as a user runs it: ``--output`` writes the answers as ``--out`` does, with one deprecation line."""
    source = write_jsonl(tmp_path / "prompts.jsonl", PROMPT_ROWS[:1])
    output = tmp_path / "regen.jsonl"
    argv = ["regenerate", "--input", source, "--output", str(output), "--backend", "http",
            "--model", server.model_name, "--endpoint", server.url, "--max-new-tokens", "4", "--no-progress"]
    proc = subprocess.run([sys.executable, "-m", "deepspec_train.commands.dispatch", *argv], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    notices = [line for line in proc.stderr.splitlines() if "--output" in line]
    assert notices == ["warning: --output is deprecated: use --out, as every deepspec verb does"], proc.stderr
    assert [row["id"] for row in read_jsonl(str(output))] == ["a"]


def test_local_regeneration_records_its_settings_and_tokens_per_second(model_dir: str, tmp_path: Path,
                                                                       capsys) -> None:
    """``--backend local`` prints its answer tokens per second and appends how the answers were generated to
    ``<out>.settings.json``, one run per invocation (a resumed run adds its own)."""
    source = write_jsonl(tmp_path / "prompts.jsonl", PROMPT_ROWS[:2])
    output = tmp_path / "regen.jsonl"
    argv = ["--input", source, "--out", str(output), "--backend", "local", "--model", model_dir,
            "--max-new-tokens", "4", "--temperature", "0", "--no-progress"]
    assert cli.main(argv) == 0 and cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "answer tokens in" in printed and "tokens/s" in printed
    record = json.loads(Path(f"{output}.settings.json").read_text())
    first, resumed = record["runs"]
    assert record["input"] == source and first["model"] == model_dir and first["backend"] == "local"
    assert first["sampling"]["max_new_tokens"] == 4 and first["sampling"]["temperature"] == 0.0
    assert first["answer_tokens"] > 0 and first["tokens_per_s"] > 0 and resumed["answer_tokens"] == 0
