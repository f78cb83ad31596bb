"""Bring your own data and target, run as a user runs it: GSM8K's question/answer rows train as they are, plain
text trains a drafter for a base model (the tiny world's target with its chat template removed) that exports
and reloads equal, and data a run cannot use ends ``python train.py`` with status 2 and one line, before the
target loads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepspec_train.export.exporter import export_drafter
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.jobs import colocated
from deepspec_train.commands.train_entry import main as train_main
from deepspec_train.jobs.run import run_training
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.tiny_world_overrides import training_overrides, world_overrides

REPO = Path(__file__).resolve().parents[1]
GSM8K_TRAIN = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
needs_gsm8k = pytest.mark.skipif(not GSM8K_TRAIN.is_file(), reason=f"GSM8K is not at {GSM8K_TRAIN}")
RECIPE = "tiny-dspark"


def base_model(tiny_world: Path, directory: Path) -> Path:
    """The tiny world's target without a chat template, as a pretrained checkpoint comes."""
    target = directory / "base_target"
    shutil.copytree(tiny_world / "target", target)
    (target / "chat_template.jinja").unlink()
    assert "chat_template" not in json.loads((target / "tokenizer_config.json").read_text())
    return target


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def text_rows(tiny_world: Path, count: int) -> list[dict]:
    """Plain text from the tiny world's conversations (their user and assistant contents, one text a row)."""
    texts = []
    for line in (tiny_world / "conversations" / "train.jsonl").read_text().splitlines():
        texts.extend(m["content"] for m in json.loads(line)["messages"] if m["content"].strip())
    return [{"text": text[:600]} for text in texts[:count]]


def quick_run(tiny_world: Path, out: Path, data: str, *extra: str) -> list[str]:
    """Two training steps of four sequences on ``data``, without validation."""
    return [
        *training_overrides(tiny_world, RECIPE, out, steps=2), f"data.train=[{data}]", "data.validation=[]", *extra,
    ]


@needs_gsm8k
@pytest.mark.parametrize("row_format", ["auto", "question_answer"])
def test_gsm8k_trains_as_question_answer_rows(tiny_world: Path, tmp_path: Path, row_format: str) -> None:
    cfg = load_recipe(RECIPE, quick_run(tiny_world, tmp_path, str(GSM8K_TRAIN), f"data.format={row_format}"))
    assert run_training(cfg).steps == 2


@pytest.mark.slow
def test_text_rows_train_a_base_model_drafter_that_exports_and_reloads_equal(tiny_world, tmp_path) -> None:
    target = base_model(tiny_world, tmp_path)
    data = write_rows(tmp_path / "text.jsonl", text_rows(tiny_world, 16))
    cfg = load_recipe(RECIPE, quick_run(tiny_world, tmp_path, str(data), f"target.path={target}"))
    assert run_training(cfg).steps == 2
    trained = tmp_path / "run" / "drafter"
    export_drafter(trained, target, tmp_path / "export", dtype=torch.float32)
    reloaded = load_exported_drafter(tmp_path / "export", str(target)).module.state_dict()
    original = load_exported_drafter(trained, str(target)).module.state_dict()
    assert reloaded.keys() == original.keys()
    assert all(torch.equal(reloaded[name], original[name]) for name in original)


def run_train_py(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "train.py", f"recipe={RECIPE}", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


# Each case: its data (and extra overrides) given the tiny world and a scratch directory, and what its line says.
REFUSALS = {
    "gsm8k read as chat rows": (
        lambda world, d: (str(GSM8K_TRAIN), ["data.format=chat"]),
        [f"{GSM8K_TRAIN}: 7473 rows read as chat (data.format=chat), 0 kept, skipped 7473 missing_field",
         f"(first: {GSM8K_TRAIN}:1: missing_field", "change data.format, data.fields"],
    ),
    "prompt and completion under other names": (
        lambda world, d: (str(write_rows(d / "pc.jsonl", [{"query": "2+3=", "reply": "5"}] * 50)), []),
        ["50 rows read as no known row shape (data.format=auto), 0 kept, skipped 50 missing_field",
         "question_answer (question, answer)", "change data.format, data.fields"],
    ),
    "text rows too few for a step": (
        lambda world, d: (str(write_rows(d / "text.jsonl", text_rows(world, 3))), []),
        ["data.train: 3 usable rows, fewer than one step's 4 (train.global_batch_sequences)",
         "3 rows read as text (data.format=auto), 3 kept"],
    ),
    "chat rows for a base model": (
        lambda world, d: (str(world / "conversations" / "train.jsonl"), [f"target.path={base_model(world, d)}"]),
        ["(chat rows) needs a chat template, and the target's tokenizer has none", "set data.chat_template"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_train_py_refuses_data_it_cannot_use_in_one_line(tiny_world: Path, tmp_path: Path, case: str) -> None:
    make, expected = REFUSALS[case]
    if "gsm8k" in case and not GSM8K_TRAIN.is_file():
        pytest.skip(f"GSM8K is not at {GSM8K_TRAIN}")
    data, extra = make(tiny_world, tmp_path)
    proc = run_train_py(quick_run(tiny_world, tmp_path, data, *extra))
    line = one_error_line(proc.stderr)
    assert proc.returncode == 2 and all(part in line for part in expected), line


def test_a_mostly_skipped_source_stops_before_the_target_loads(tiny_world, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(colocated, "load_target_model", lambda *a, **k: pytest.fail("the target was loaded"))
    good = (tiny_world / "conversations" / "train.jsonl").read_text().splitlines()[:8]
    data = tmp_path / "mostly_bad.jsonl"
    data.write_text("\n".join(good + ["{oops"] * 12) + "\n")
    status = train_main([f"recipe={RECIPE}", *quick_run(tiny_world, tmp_path, str(data))])
    line = one_error_line(capsys.readouterr().err)
    assert status == 2 and "more than 50% of a source's rows skipped (data.max_skipped_fraction = 0.5" in line
    assert "20 rows read as chat (data.format=auto)" in line and " 12 invalid_json" in line
    assert f"(first: {data}:" in line, line


def test_validation_rows_too_few_for_the_drafter_ranks_stop_in_one_line(tiny_world, tmp_path, capsys) -> None:
    data = write_rows(tmp_path / "val.jsonl", [{"question": "2+3?", "answer": ""}])
    args = [f"recipe={RECIPE}", *world_overrides(tiny_world, RECIPE, tmp_path), f"data.validation=[{data}]",
            f"data.cache_dir={tmp_path / 'cache'}", "logging.wandb=false", "data.max_skipped_fraction=1"]
    status = train_main(args)
    line = one_error_line(capsys.readouterr().err)
    assert status == 2 and "data.validation: 0 usable rows, fewer than one validation pass's 1" in line, line
    assert f"(first: {data}:1: empty_assistant" in line


def test_regeneration_and_the_evaluator_need_a_template_for_a_base_model(tiny_world, tmp_path) -> None:
    from deepspec_train.data.chat_templates import ChatTemplateMissingError
    from deepspec_train.evaluation.speculative_decoder import prompt_tokenizer
    from deepspec_train.regenerate.local_backend import LocalBackend
    from deepspec_train.regenerate.sampling import SamplingParams

    target = str(base_model(tiny_world, tmp_path))
    for make in (lambda: LocalBackend(target), lambda: prompt_tokenizer(target)):
        with pytest.raises(ChatTemplateMissingError, match="needs a chat template.*set --chat-template"):
            make()
    assert prompt_tokenizer(target, "chatml").chat_template
    assert LocalBackend(target, chat_template="chatml").render_prompt(
        [{"role": "user", "content": "Hi"}], SamplingParams()
    ).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
