"""Open-PerfectBlend preparation (data/prepare_open_perfectblend.py) and shard pre-tokenisation
(data/tokenize_shards.py) on a small fake dataset in the real schema (ShareGPT ``conversations`` + ``source``,
as parquet like the hub's files): split determinism, dedup, length filter, resume."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.parquet as pq

from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.tiny_chat_model import save_tiny_chat_model

REPO = Path(__file__).resolve().parents[1]


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "data" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prep = _load_script("prepare_open_perfectblend")
tokenize_shards = _load_script("tokenize_shards")


def _row(prompt: str, answer: str = "Sure.", source: str = "fake/math", system: str | None = None) -> dict:
    turns = [{"from": "system", "value": system}] if system else []
    turns += [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer},
              {"from": "human", "value": "And then?"}, {"from": "gpt", "value": "Done."}]
    return {"conversations": turns, "source": source}


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _fake_rows(count: int) -> list[dict]:
    return [_row(f"Question number {i}: what is {i} plus {i}?", f"It is {2 * i}.") for i in range(count)]


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prompts_dedup_length_filter_and_turns(tmp_path: Path) -> None:
    rows = [
        _row("What is the capital of France?", system="Be brief."),
        _row("  what IS the capital   of france? ", source="fake/dup"),  # duplicate after normalisation
        _row("x" * 500),  # too long for --max-prompt-chars 200
        _row("hi"),  # too short for --min-prompt-chars 5
        {"conversations": [{"from": "gpt", "value": "no prompt"}], "source": "fake/bad"},
        {"conversations": [{"from": "alien", "value": "?"}], "source": "fake/bad"},
        _row("Write a haiku about rain."),
    ]
    source = _write_parquet(tmp_path / "src" / "data" / "train-00000-of-00001.parquet", rows)
    manifest = prep.prepare(str(source.parent.parent), tmp_path / "out", validation_fraction=0.0,
                            min_prompt_chars=5, max_prompt_chars=200)
    kept = _read(tmp_path / "out" / "train.jsonl")
    assert [r["messages"] for r in kept] == [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}],
        [{"role": "user", "content": "Write a haiku about rain."}],
    ]
    assert [r["category"] for r in kept] == ["fake/math", "fake/math"]
    assert len({r["id"] for r in kept}) == 2
    assert manifest["dropped"] == {"duplicate": 1, "length_chars": 2, "no_user_prompt": 1, "unknown_role": 1}
    assert _read(tmp_path / "out" / "validation.jsonl") == []


def test_token_length_filter(tmp_path: Path) -> None:
    tokenizer_dir = save_tiny_chat_model(tmp_path / "model")
    rows = [_row("short prompt"), _row(" ".join(f"word{i}" for i in range(200)))]
    source = _write_parquet(tmp_path / "src.parquet", rows)
    manifest = prep.prepare(str(source), tmp_path / "out", validation_fraction=0.0,
                            tokenizer_path=tokenizer_dir, max_prompt_tokens=50)
    assert manifest["counts"]["train"] == 1 and manifest["dropped"] == {"length_tokens": 1}


def test_split_is_deterministic_and_row_independent(tmp_path: Path) -> None:
    rows = _fake_rows(2000)
    first = prep.prepare(str(_write_parquet(tmp_path / "a.parquet", rows)), tmp_path / "a")
    # Same prompts in another order plus new ones: every old prompt keeps its split.
    shuffled = rows[::-1] + _fake_rows(2300)[2000:]
    prep.prepare(str(_write_parquet(tmp_path / "b.parquet", shuffled)), tmp_path / "b")
    split_a = {r["id"]: s for s in prep.SPLITS for r in _read(tmp_path / "a" / f"{s}.jsonl")}
    split_b = {r["id"]: s for s in prep.SPLITS for r in _read(tmp_path / "b" / f"{s}.jsonl")}
    assert all(split_b[key] == split for key, split in split_a.items())
    fraction = first["counts"]["validation"] / 2000
    assert 0.035 < fraction < 0.065  # 5% +- 3 standard deviations of a binomial over 2000 prompts


def test_rerun_resumes_and_rebuilds_on_change(tmp_path: Path) -> None:
    source = _write_parquet(tmp_path / "src.parquet", _fake_rows(50))
    out = tmp_path / "out"
    assert prep.prepare(str(source), out)["reused"] is False
    stamp = (out / "train.jsonl").stat().st_mtime_ns
    assert prep.prepare(str(source), out)["reused"] is True
    assert (out / "train.jsonl").stat().st_mtime_ns == stamp
    # A damaged output, or other settings, rebuild.
    (out / "train.jsonl").write_text("")
    assert prep.prepare(str(source), out)["reused"] is False
    assert len(_read(out / "train.jsonl")) + len(_read(out / "validation.jsonl")) == 50
    assert prep.prepare(str(source), out, max_prompt_chars=30)["reused"] is False
    assert prep.main([f"--source={source}", f"--out={out}", "--max-prompt-chars=30"]) == 0


def test_tokenize_shards_fills_the_cache_training_reads(tmp_path: Path) -> None:
    target = save_tiny_chat_model(tmp_path / "model")
    conversations = tmp_path / "train.jsonl"
    conversations.write_text("".join(
        json.dumps({"id": i, "messages": [{"role": "user", "content": f"q{i}"},
                                          {"role": "assistant", "content": f"answer {i}"}]}) + "\n"
        for i in range(6)
    ))
    args = ["recipe=tiny-dspark", f"target.path={target}", f"data.train=[{conversations}]", "data.validation=[]",
            f"data.cache_dir={tmp_path / 'cache'}"]
    first = tokenize_shards.tokenize_recipe_data(load_recipe(args[0][7:], args[1:], check_target=False), progress=False)
    assert first["train"].kept == 6 and not first["train"].from_cache
    second = tokenize_shards.tokenize_recipe_data(load_recipe(args[0][7:], args[1:], check_target=False), progress=False)
    assert second["train"].from_cache and second["train"].cache_path == first["train"].cache_path
    assert tokenize_shards.main(args) == 0
    assert tokenize_shards.main(["recipe=tiny-dspark", "data.no_such_key=1"]) == 2
