"""Test helper: a small file in the published schema of every benchmark suite, prepared into the evaluator's
prompt files with ``deepspec suites prepare``.

GSM8K and HumanEval come from ``../shared/datasets`` when that folder is there (the real releases), otherwise
from two-row files in their schema, so the comparison tests run on any machine.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from deepspec_train.commands.dispatch import main

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_published_files(directory: Path) -> dict[str, Path]:
    """``{suite: dataset file or folder}`` for the ten suites, two rows each outside the shared releases."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "gsm8k": SHARED / "gsm8k" if (SHARED / "gsm8k").is_dir() else _jsonl(directory / "gsm8k-test.jsonl", [
            {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "Half of 10?", "answer": "#### 5"}]),
        "aime24": _jsonl(directory / "aime24.jsonl", [{"id": 60, "problem": "Find $n$ if $2^n = 8$."},
                                                      {"id": 61, "problem": "Find the sum $1+2+3$."}]),
        "aime25": _jsonl(directory / "aime25.jsonl", [{"problem_idx": 1, "problem": "Find $b > 9$ with $17_b | 97_b$."},
                                                      {"problem_idx": 2, "problem": "Compute $7 \\cdot 6$."}]),
        "mbpp": _jsonl(directory / "mbpp.jsonl", [{"task_id": 2, "prompt": "Write a function to add two numbers."},
                                                  {"task_id": 3, "prompt": "Write a function to reverse a list."}]),
        "livecodebench": _jsonl(directory / "test.jsonl", [
            {"question_id": "abc1", "question_content": "Print the sum of A and B.", "starter_code": ""},
            {"question_id": "lc2", "question_content": "Return n squared.",
             "starter_code": "class Solution:\n    def sq(self, n: int) -> int:\n        "}]),
        "alpaca": directory / "alpaca_data.json",
        "mt-bench": directory / "mt_bench.parquet",
        "arena-hard": _jsonl(directory / "question.jsonl", [
            {"uid": "a1", "category": "hard_prompt", "prompt": "Explain a hash map to a child."},
            {"uid": "a2", "category": "coding", "prompt": "Write a zig program that prints 1."}]),
        "math500": directory / "math500.parquet",
    }
    (directory / "alpaca_data.json").write_text(json.dumps([
        {"instruction": "Give three tips for staying healthy.", "input": "", "output": "Eat."},
        {"instruction": "Summarise the text.", "input": "The cat sat on the mat.", "output": "A cat sat."}]))
    pq.write_table(pa.Table.from_pylist([
        {"prompt": ["Write a haiku about the sea.", "Now about the sky."], "prompt_id": 81, "category": "writing"},
        {"prompt": ["Name two prime numbers.", "Why are they prime?"], "prompt_id": 101, "category": "math"}]),
        directory / "mt_bench.parquet")
    pq.write_table(pa.Table.from_pylist([{"problem": "What is $1+1$?", "unique_id": "test/a/1.json"},
                                         {"problem": "Simplify $\\frac{4}{8}$.", "unique_id": "test/b/2.json"}]),
                   directory / "math500.parquet")
    if (SHARED / "humaneval").is_dir():
        files["humaneval"] = SHARED / "humaneval"
    else:
        files["humaneval"] = directory / "HumanEval.jsonl.gz"
        with gzip.open(files["humaneval"], "wt") as handle:
            for i, stub in enumerate(['def add(a, b):\n    """Add a and b."""\n', 'def neg(x):\n    """-x."""\n']):
                handle.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": stub}) + "\n")
    return files


def prepare_all_suites(directory: Path, sample: int | None = None) -> dict[str, Path]:
    """``{suite: prepared prompt file}`` for every suite, each cut to ``sample`` prompts when given."""
    prepared = {}
    for name, source in write_published_files(directory / "published").items():
        out = directory / "suites" / f"{name}.jsonl"
        extra = ["--sample", str(sample)] if sample else []
        assert main(["suites", "prepare", name, "--input", str(source), "--out", str(out), "--no-progress",
                     *extra]) == 0
        prepared[name] = out
    return prepared
