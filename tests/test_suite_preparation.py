"""``deepspec suites prepare``: every published suite from a file in its published schema, prompts as DeepSpec's
evaluation builds them, and a one-line failure for a wrong or missing file.

GSM8K and HumanEval come from ``../shared/datasets`` (skipped with the reason when that folder is absent); every
other schema is a small fixture written here, in the file types users have: Parquet, JSON arrays, JSONL, a
``datasets.save_to_disk`` directory, a ``datasets`` cache directory of Arrow files, a folder of releases.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deepspec_train.commands.dispatch import main
from deepspec_train.evaluation.suites import load_suite
from deepspec_train.suites.benchmarks import BENCHMARK_SUITES, HUMANEVAL_INSTRUCTION, REASONING_INSTRUCTION
from deepspec_train.suites.prepare import DEEPSPEC_SEED, draw_sample

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
LIVECODEBENCH_HEAD = "You are an expert Python programmer. You will be given a question (problem specification)"


def _prepare(name: str, source: Path, out: Path, *extra: str) -> list[dict]:
    assert main(["suites", "prepare", name, "--input", str(source), "--out", str(out), "--no-progress", *extra]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert load_suite(f"{name}={out}").name == name, "the evaluator must read the prepared file under its name"
    return rows


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _shared(name: str) -> Path:
    if not (SHARED / name).is_dir():
        pytest.skip(f"{SHARED / name} is absent: the shared public datasets are not mounted next to the repository")
    return SHARED / name


def test_gsm8k_from_the_shared_folder_picks_the_test_split(tmp_path):
    folder = _shared("gsm8k")
    rows = _prepare("gsm8k", folder, tmp_path / "gsm8k.jsonl")
    source = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
    assert len(rows) == len(source) == 1319
    assert [r["turns"] for r in rows] == [[s["question"] + REASONING_INSTRUCTION] for s in source]
    assert rows[0]["turns"][0].endswith("put your final answer within \\boxed{}.")
    assert {r["category"] for r in rows} == {"gsm8k"} and rows[5]["id"] == "5"


def test_humaneval_from_the_gzipped_release_with_a_deepspec_sample(tmp_path):
    folder = _shared("humaneval")
    rows = _prepare("humaneval", folder, tmp_path / "he.jsonl")
    with gzip.open(folder / "HumanEval.jsonl.gz", "rt") as handle:
        source = [json.loads(line) for line in handle]
    assert [r["id"] for r in rows] == [s["task_id"] for s in source]
    assert rows[0]["turns"] == [f"{HUMANEVAL_INSTRUCTION}\n```python\n{source[0]['prompt']}\n```"]
    sampled = _prepare("humaneval", folder / "HumanEval.jsonl.gz", tmp_path / "he10.jsonl", "--sample", "10")
    order = list(range(len(source)))
    random.Random(DEEPSPEC_SEED).shuffle(order)
    assert [r["id"] for r in sampled] == [source[i]["task_id"] for i in order[:10]]


def test_math500_parquet_and_aime_json_arrays(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"problem": "What is $1+1$?", "answer": "2", "unique_id": "test/a/1.json"},
                                         {"problem": "Solve $x^2=4$.", "answer": "2", "unique_id": "test/b/2.json"}]),
                   tmp_path / "test-00000-of-00001.parquet")
    rows = _prepare("math500", tmp_path / "test-00000-of-00001.parquet", tmp_path / "m.jsonl")
    assert rows[1] == {"id": "test/b/2.json", "category": "math500",
                       "turns": ["Solve $x^2=4$." + REASONING_INSTRUCTION]}
    aime24 = [{"id": 60, "problem": "Find $n$.", "solution": "", "answer": "3"}]
    (tmp_path / "aime24.json").write_text(json.dumps(aime24))
    assert _prepare("aime24", tmp_path / "aime24.json", tmp_path / "a24.jsonl")[0]["id"] == "60"
    _jsonl(tmp_path / "aime25" / "train.jsonl", [{"problem_idx": 1, "problem": "Find $b$.", "answer": "70"}])
    rows = _prepare("aime25", tmp_path / "aime25", tmp_path / "a25.jsonl")
    assert rows == [{"id": "1", "category": "aime25", "turns": ["Find $b$." + REASONING_INSTRUCTION]}]


def test_mbpp_from_a_saved_dataset_dict_takes_the_test_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    split = lambda ids: datasets.Dataset.from_list(  # noqa: E731
        [{"task_id": i, "prompt": f"Write a function number {i}.", "code": "", "test_list": []} for i in ids])
    datasets.DatasetDict({"train": split([1, 2]), "test": split([11, 12, 13])}).save_to_disk(str(tmp_path / "mbpp"))
    rows = _prepare("mbpp", tmp_path / "mbpp", tmp_path / "mbpp.jsonl")
    assert [(r["id"], r["turns"]) for r in rows] == [(str(i), [f"Write a function number {i}."]) for i in (11, 12, 13)]
    _jsonl(tmp_path / "full.jsonl", [{"task_id": 7, "text": "Write a python function to add.", "code": ""}])
    full = _prepare("mbpp", tmp_path / "full.jsonl", tmp_path / "f.jsonl")
    assert full[0]["turns"] == ["Write a python function to add."]


def test_gsm8k_from_a_datasets_cache_directory_of_arrow_files(tmp_path):
    cache = tmp_path / "openai___gsm8k" / "main" / "0.0.0" / "0123abcd"
    cache.mkdir(parents=True)
    for split, questions in (("train", ["train question"]), ("test", ["q one", "q two"])):
        table = pa.Table.from_pylist([{"question": q, "answer": "#### 1"} for q in questions])
        with pa.OSFile(str(cache / f"gsm8k-{split}.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    rows = _prepare("gsm8k", tmp_path / "openai___gsm8k", tmp_path / "g.jsonl")
    assert [r["turns"][0] for r in rows] == ["q one" + REASONING_INSTRUCTION, "q two" + REASONING_INSTRUCTION]
    assert main(["suites", "prepare", "gsm8k", "--input", str(tmp_path / "openai___gsm8k"), "--out",
                 str(tmp_path / "v.jsonl"), "--split", "validation", "--no-progress"]) == 2


def test_livecodebench_releases_with_and_without_starter_code(tmp_path):
    _jsonl(tmp_path / "lcb" / "test.jsonl",
           [{"question_id": "abc301_a", "question_content": "Read N.", "starter_code": ""}])
    _jsonl(tmp_path / "lcb" / "test2.jsonl", [{"question_id": "lc1", "question_content": "Sum it.",
                                                "starter_code": "class Solution:\n    def f(self): pass"}])
    rows = _prepare("livecodebench", tmp_path / "lcb", tmp_path / "lcb.jsonl")
    assert [r["id"] for r in rows] == ["abc301_a", "lc1"]
    first, second = rows[0]["turns"][0], rows[1]["turns"][0]
    assert first.startswith(LIVECODEBENCH_HEAD) and "### Question:\nRead N.\n\n" in first
    assert "### Format: Write your code in the following format:\n```python\n# YOUR CODE HERE\n```" in first
    assert "### Format: Use the following code structure:\n```python\nclass Solution:" in second
    assert second.endswith("### Answer: (use the provided format with backticks)")


def test_mt_bench_first_turn_by_default_every_turn_on_request(tmp_path):
    table = pa.Table.from_pylist([{"prompt": ["Write a poem.", "Now shorter."], "prompt_id": 81,
                                   "category": "writing", "reference": []}])
    pq.write_table(table, tmp_path / "train.parquet")
    assert _prepare("mt-bench", tmp_path / "train.parquet", tmp_path / "mt.jsonl") == [
        {"id": "81", "category": "writing", "turns": ["Write a poem."]}]
    both = _prepare("mt-bench", tmp_path / "train.parquet", tmp_path / "mt2.jsonl", "--all-turns")
    assert both[0]["turns"] == ["Write a poem.", "Now shorter."]
    fastchat = _jsonl(tmp_path / "question.jsonl",
                      [{"question_id": 82, "category": "roleplay", "turns": ["Hi", "Bye"]}])
    assert _prepare("mt-bench", fastchat, tmp_path / "fc.jsonl")[0]["turns"] == ["Hi"]


def test_alpaca_and_arena_hard_schemas(tmp_path):
    (tmp_path / "alpaca_data.json").write_text(json.dumps([
        {"instruction": "Give three tips.", "input": "", "output": "1."},
        {"instruction": "Translate.", "input": "Bonjour", "output": "Hello"},
    ]))
    rows = _prepare("alpaca", tmp_path / "alpaca_data.json", tmp_path / "al.jsonl")
    assert [r["turns"] for r in rows] == [["Give three tips."], ["Translate.\n\nInput:\nBonjour"]]
    v2 = _jsonl(tmp_path / "v2" / "question.jsonl", [{"uid": "u1", "category": "hard_prompt", "prompt": "Zig?"}])
    assert _prepare("arena-hard", v2, tmp_path / "ah.jsonl") == [
        {"id": "u1", "category": "hard_prompt", "turns": ["Zig?"]}]
    v01 = _jsonl(tmp_path / "v01.jsonl", [{"question_id": "q9", "category": "arena-hard-v0.1",
                                           "turns": [{"content": "Explain monads."}]}])
    assert _prepare("arena-hard", v01, tmp_path / "ah1.jsonl")[0]["turns"] == ["Explain monads."]


@pytest.mark.parametrize("name", sorted(BENCHMARK_SUITES))
def test_a_wrong_file_fails_in_one_line(name, tmp_path, capsys):
    wrong = _jsonl(tmp_path / "wrong.jsonl", [{"text_of_another_dataset": 1, "label": 0}])
    out = tmp_path / "out.jsonl"
    assert main(["suites", "prepare", name, "--input", str(wrong), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {wrong}:1: a {name} row needs the field"), err
    assert not out.exists(), "a failed preparation must not leave a prompt file"


def test_missing_empty_and_broken_files_fail_in_one_line(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text('{"question": "ok"}\n{not json\n')
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip")
    cases = {"missing.jsonl": "no such file", "empty.jsonl": "empty", "broken.jsonl": "broken.jsonl:2: bad row",
             "notes.txt": "unsupported file type", "broken.jsonl.gz": "not a readable gzip file"}
    for file, message in cases.items():
        argv = ["suites", "prepare", "gsm8k", "--input", str(tmp_path / file), "--out", str(tmp_path / "o.jsonl"),
                "--no-progress"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (file, err)
    assert main(["suites", "prepare", "gsm8", "--input", "x", "--out", "y"]) == 2
    assert "did you mean 'gsm8k'" in capsys.readouterr().err


def test_sample_is_deepspec_draw_and_keeps_small_suites_whole():
    prompts = list(range(40))
    order = list(prompts)
    random.Random(7).shuffle(order)
    assert draw_sample(prompts, 5, seed=7) == order[:5]
    assert draw_sample(prompts, 40, seed=7) == prompts and draw_sample(prompts, None) == prompts
