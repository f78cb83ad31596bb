"""One record per published benchmark suite: where its rows come from and how a row becomes the user turns that
``deepspec eval`` decodes.

The prompt of each suite is the one DeepSpec's evaluation decodes (facts read from deepseek-ai/DeepSpec's dataset
converter and evaluator): math problems get the step-by-step instruction with a boxed answer, HumanEval's function
stub is wrapped in a Python fence with a "make sure it passes the tests" instruction, LiveCodeBench gets its
"expert Python programmer" frame around the question and the starter code, Alpaca appends a non-empty ``input``
after the instruction, and MBPP, MT-Bench and Arena-Hard take the dataset's text as is. DeepSpec decodes only the
first user turn of every row (MT-Bench too) with thinking disabled through the chat template's
``enable_thinking`` switch; the evaluator here renders every prompt with that switch off
(``evaluation.speculative_decoder.CHAT_TEMPLATE_KWARGS``), and ``first_turn_only`` keeps the rest of a row's turns
out of the prepared file unless asked for.

``paper_prompts`` is how many prompts of the suite DeepSpec's evaluation draws (a seeded shuffle, then the first
N); ``BENCHMARK_SUITES`` maps each suite name to its record.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepspec_train.common.errors import UserError

REASONING_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_INSTRUCTION = "Write a solution to the following problem and make sure that it passes the tests:"
LIVECODEBENCH_FRAME = (
    "You are an expert Python programmer. You will be given a question (problem specification) and will generate "
    "a correct Python program that matches the specification and passes all tests. You will NOT return anything "
    "except for the program"
)


class SuiteRowError(UserError, ValueError):
    """A dataset row that lacks what its suite's prompt is built from (usually: the file of another dataset)."""


def row_field(row: dict[str, Any], names: tuple[str, ...], suite: str) -> Any:
    """The value of the first of ``names`` that ``row`` has (the published schemas differ between releases)."""
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    wanted = " or ".join(repr(n) for n in names)
    raise SuiteRowError(f"a {suite} row needs the field {wanted}; this row has {sorted(row)}: is it a {suite} file?")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SuiteRowError(f"{what} must be a non-empty string, got {type(value).__name__}")
    return value


def math_turns(row: dict[str, Any], suite: str, fields: tuple[str, ...]) -> list[str]:
    return [_text(row_field(row, fields, suite), f"{suite} problem") + REASONING_INSTRUCTION]


def humaneval_turns(row: dict[str, Any], suite: str) -> list[str]:
    stub = _text(row_field(row, ("prompt",), suite), "HumanEval prompt")
    return [f"{HUMANEVAL_INSTRUCTION}\n```python\n{stub}\n```"]


def alpaca_turns(row: dict[str, Any], suite: str) -> list[str]:
    instruction = _text(row_field(row, ("instruction",), suite), "Alpaca instruction")
    extra = row.get("input") or ""
    return [f"{instruction}\n\nInput:\n{extra}" if extra else instruction]


def livecodebench_turns(row: dict[str, Any], suite: str) -> list[str]:
    # Some LiveCodeBench exports already hold chat messages; their user messages are the turns.
    if isinstance(row.get("messages"), list):
        turns = [m.get("content") for m in row["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        if not turns:
            raise SuiteRowError(f"a {suite} row with 'messages' has no user message")
        return [_text(t, f"{suite} user message") for t in turns]
    question = _text(row_field(row, ("question_content",), suite), "LiveCodeBench question_content")
    starter = row.get("starter_code") or ""
    label = "Use the following code structure:" if starter else "Write your code in the following format:"
    code = starter or "# YOUR CODE HERE"
    return [
        f"{LIVECODEBENCH_FRAME}\n\n### Question:\n{question}\n\n### Format: {label}\n```python\n{code}\n```\n\n"
        "### Answer: (use the provided format with backticks)"
    ]


def listed_turns(row: dict[str, Any], suite: str, fields: tuple[str, ...]) -> list[str]:
    """Turns given as a list of strings (HF MT-Bench ``prompt``, FastChat ``turns``), or as a list of
    ``{"content": ...}`` messages (Arena-Hard v0.1), or one string (Arena-Hard v2)."""
    value = row_field(row, fields, suite)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise SuiteRowError(f"a {suite} row's {fields[0]!r} must be a string or a non-empty list of turns")
    return [_text(t.get("content") if isinstance(t, dict) else t, f"{suite} turn") for t in items]


@dataclass(frozen=True)
class BenchmarkSuite:
    """A published suite: its Hugging Face source and default split, its domain (the paper groups math, code
    and chat), the fields that identify a row, how a row becomes user turns, and DeepSpec's sample size."""

    name: str
    source: str
    split: str
    domain: str
    id_fields: tuple[str, ...]
    turns: Callable[[dict[str, Any], str], list[str]]
    paper_prompts: int
    first_turn_only: bool = True

    def build_turns(self, row: dict[str, Any]) -> list[str]:
        return self.turns(row, self.name)

    def prompt_id(self, row: dict[str, Any], index: int) -> str:
        """The dataset's own id when the schema has one, else the row's index in its split."""
        return next((str(row[f]) for f in self.id_fields if row.get(f) is not None), str(index))


def _math(fields: tuple[str, ...]) -> Callable[[dict[str, Any], str], list[str]]:
    return lambda row, suite: math_turns(row, suite, fields)


def _listed(fields: tuple[str, ...]) -> Callable[[dict[str, Any], str], list[str]]:
    return lambda row, suite: listed_turns(row, suite, fields)


_SUITES = (
    BenchmarkSuite("gsm8k", "openai/gsm8k (main)", "test", "math", (), _math(("question",)), 500),
    BenchmarkSuite("math500", "HuggingFaceH4/MATH-500", "test", "math", ("unique_id",), _math(("problem",)), 500),
    BenchmarkSuite("aime24", "HuggingFaceH4/aime_2024", "train", "math", ("id",), _math(("problem",)), 30),
    BenchmarkSuite("aime25", "MathArena/aime_2025", "train", "math", ("problem_idx", "id"), _math(("problem",)), 30),
    BenchmarkSuite("humaneval", "openai/openai_humaneval", "test", "code", ("task_id",), humaneval_turns, 164),
    # The sanitized config (DeepSpec's) calls the task "prompt"; the full config calls it "text".
    BenchmarkSuite("mbpp", "google-research-datasets/mbpp (sanitized)", "test", "code", ("task_id",),
                   _listed(("prompt", "text")), 256),
    BenchmarkSuite("livecodebench", "livecodebench/code_generation_lite", "test", "code", ("question_id",),
                   livecodebench_turns, 500),
    BenchmarkSuite("mt-bench", "HuggingFaceH4/mt_bench_prompts", "train", "chat", ("prompt_id", "question_id"),
                   _listed(("prompt", "turns")), 80),
    BenchmarkSuite("alpaca", "tatsu-lab/alpaca", "train", "chat", (), alpaca_turns, 500),
    BenchmarkSuite("arena-hard", "lmarena-ai/arena-hard-auto (v2.0 question.jsonl)", "train", "chat",
                   ("uid", "question_id"), _listed(("prompt", "turns")), 500),
)
BENCHMARK_SUITES: dict[str, BenchmarkSuite] = {suite.name: suite for suite in _SUITES}


def benchmark_suite(name: str) -> BenchmarkSuite:
    """The record of suite ``name``; an unknown name fails in one line with the closest known one."""
    if name in BENCHMARK_SUITES:
        return BENCHMARK_SUITES[name]
    close = difflib.get_close_matches(name, BENCHMARK_SUITES, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UserError(f"unknown suite {name!r}{hint}; known suites: {', '.join(BENCHMARK_SUITES)}")
