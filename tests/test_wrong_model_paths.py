"""A wrong target or drafter path ends in one line naming the setting, exit status 2, in seconds, for
``train.py`` and every verb that takes one (``model_folders``): a path that does not exist, a folder that is not a
model folder, weights that are not safetensors, and a hub id while the hub is unreachable. The commands run as a
user runs them (a subprocess); the hub is made unreachable by pointing ``HF_ENDPOINT`` at a closed local port, so
the tests do not depend on this machine's network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from deepspec_train.common.errors import UserError
from deepspec_train.common.model_folders import (
    check_drafter_folder, check_target_folder, is_hub_id, safetensors_problem,
)
from tests.helpers.checkable_target import write_bad_weights, write_chat_rows, write_checkable_target

REPO = Path(__file__).resolve().parents[1]
# Far below the minute the hub's retries took; generous for a busy 2-core machine importing torch.
SECONDS = 30
# Nothing listens on port 9 (discard): a connection there is refused at once.
NO_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("paths")
    target = write_checkable_target(root / "target")
    bad = write_bad_weights(write_checkable_target(root / "bad_weights"))
    not_a_model = root / "notes"
    not_a_model.mkdir()
    (not_a_model / "README.md").write_text("not a model\n")
    return {"root": root, "target": target, "bad": bad, "notes": not_a_model, "missing": root / "missing",
            "rows": write_chat_rows(root / "train.jsonl"), "traces": write_chat_rows(root / "traces.jsonl"),
            "suite": write_suite(root / "suite.jsonl")}


def write_suite(path: Path) -> Path:
    path.write_text(json.dumps({"id": 1, "turns": ["What is two plus three?"]}) + "\n")
    return path


def refused(argv: list[str], cwd: Path, setting: str, reason: str) -> None:
    """Run ``argv``; it must end with status 2 and one stderr line naming ``setting`` and ``reason``, in seconds."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, **NO_HUB, "PYTHONPATH": str(REPO)})
    elapsed = time.perf_counter() - start
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {setting} ") and reason in lines[0], proc.stderr
    assert elapsed < SECONDS, f"{elapsed:.0f} s"


def deepspec(*args: str) -> list[str]:
    return [sys.executable, "-m", "deepspec_train.commands.dispatch", *args]


def test_data_check_refuses_a_missing_target_and_an_unreachable_hub_id(world) -> None:
    rows = str(world["rows"])
    refused(deepspec("data", "check", rows, "--target", str(world["missing"])), world["root"], "--target",
            "no such folder")
    # The line: a folder name shaped like a hub id, with no such folder here and no hub to ask.
    refused(deepspec("data", "check", rows, "--target", "models/Qwen3-8B"), world["root"], "--target models/Qwen3-8B:",
            "the hub is unreachable (http://127.0.0.1:9 does not answer")
    refused(deepspec("data", "check", rows, "--target", str(world["notes"])), world["root"], "--target",
            "no tokenizer there")


@pytest.mark.parametrize("case, reason", [
    ("missing", "no such folder"), ("notes", "not a model folder: no config.json there"),
    ("bad", "model.safetensors is not a safetensors file"),
])
def test_eval_refuses_a_wrong_target(world, case: str, reason: str) -> None:
    out = world["root"] / f"eval-{case}.json"
    refused(deepspec("eval", "--target", str(world[case]), "--drafter", str(world["target"]), "--suite",
                     str(world["suite"]), "--out", str(out)), world["root"], "--target", reason)
    assert not out.exists()


def test_eval_refuses_a_wrong_drafter_plain_or_named(world) -> None:
    common = ["--target", str(world["target"]), "--suite", str(world["suite"])]
    refused(deepspec("eval", *common, "--drafter", str(world["missing"]), "--out", str(world["root"] / "r.json")),
            world["root"], "--drafter", "no such folder")
    refused(deepspec("eval", *common, "--drafter", f"a={world['target']}", "--drafter", f"b={world['notes']}",
                     "--out", str(world["root"] / "cmp")),
            world["root"], "--drafter", "not a drafter folder: no config.json (an export) or drafter_config.json")


def test_export_refuses_a_wrong_drafter_or_target(world) -> None:
    out = str(world["root"] / "export")
    refused(deepspec("export", "--drafter", str(world["bad"]), "--target", str(world["target"]), "--out", out),
            world["root"], "--drafter", "model.safetensors is not a safetensors file")
    refused(deepspec("export", "--drafter", str(world["target"]), "--target", str(world["missing"]), "--out", out),
            world["root"], "--target", "no such folder")
    assert not Path(out).exists()


def test_calibrate_profile_and_regenerate_refuse_wrong_paths(world) -> None:
    refused(deepspec("calibrate", "--traces", str(world["traces"]), "--out", str(world["root"] / "cal"), "--drafter",
                     str(world["missing"])), world["root"], "--drafter", "no such folder")
    refused(deepspec("profile-sps", "--target", "org/no-such-model", "--out", str(world["root"] / "sps.json")),
            world["root"], "--target", "the hub is unreachable")
    refused(deepspec("regenerate", "--input", str(world["rows"]), "--out", str(world["root"] / "re.jsonl"),
                     "--backend", "local", "--model", str(world["bad"])),
            world["root"], "--model", "model.safetensors is not a safetensors file")


@pytest.mark.parametrize("case, reason", [
    ("missing", "no such directory"), ("notes", "no config.json there"),
    ("bad", "model.safetensors is not a safetensors file (its header is unreadable)"),
])
def test_train_py_refuses_a_wrong_target_and_writes_nothing(world, tmp_path, case: str, reason: str) -> None:
    argv = [sys.executable, str(REPO / "train.py"), "recipe=tiny-dspark", f"target.path={world[case]}",
            f"data.train=[{world['rows']}]", "data.validation=[]", f"run.output_dir={tmp_path / 'runs' / 'a'}",
            f"data.cache_dir={tmp_path / 'cache'}"]
    setting = "recipe tiny-dspark: target.path =" if case != "bad" else "target.path"
    refused(argv, tmp_path, setting, reason)
    assert list(tmp_path.iterdir()) == []


def test_train_py_refuses_a_drafter_init_from_that_is_not_a_drafter(world, tmp_path) -> None:
    argv = [sys.executable, str(REPO / "train.py"), "recipe=tiny-dspark", f"target.path={world['target']}",
            f"data.train=[{world['rows']}]", "data.validation=[]", f"drafter.init_from={world['notes']}",
            f"run.output_dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}"]
    refused(argv, tmp_path, "drafter.init_from", "not a drafter folder")
    assert list(tmp_path.iterdir()) == []


def test_the_data_scripts_refuse_a_wrong_tokenizer_folder(world, tmp_path) -> None:
    script = [sys.executable, str(REPO / "data" / "tokenize_shards.py"), "recipe=tiny-dspark"]
    refused([*script, f"target.path={world['notes']}", f"data.cache_dir={tmp_path / 'cache'}"], tmp_path,
            "target.path", "no tokenizer there")
    refused([sys.executable, str(REPO / "data" / "prepare_open_perfectblend.py"), "--source", str(world["rows"]),
             "--out", str(tmp_path / "prompts"), "--tokenizer", "org/no-such-model"], tmp_path, "--tokenizer",
            "the hub is unreachable")
    assert list(tmp_path.iterdir()) == []


def test_local_looking_values_are_never_hub_ids(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert is_hub_id("Qwen/Qwen3-8B") and is_hub_id("models/Qwen3-8B") and is_hub_id("gpt2")
    (tmp_path / "models" / "Qwen3-8B").mkdir(parents=True)
    assert not any(map(is_hub_id, ("models/Qwen3-8B", "./x", "../x", "/abs/x", "~/x", "a/b/c", "a\\b")))
    # A local path is refused without asking the hub, even with the hub allowed.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(UserError, match=r"^--target \./nowhere: no such folder$"):
        check_target_folder("./nowhere", "--target", allow_hub=True)
    with pytest.raises(UserError, match="hf download org/name --local-dir DIR"):
        check_target_folder("org/name", "target.path")


def test_weights_are_checked_by_their_headers(tmp_path) -> None:
    good = tmp_path / "model.safetensors"
    save_file({"w": np.ones((8, 8), dtype=np.float32)}, str(good))
    assert safetensors_problem(good) is None
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-16])
    assert "is cut short" in safetensors_problem(cut)
    pointer = tmp_path / "pointer.safetensors"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    assert "Git LFS pointer" in safetensors_problem(pointer)
    folder = write_checkable_target(tmp_path / "sharded")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    with pytest.raises(UserError, match="names 1 missing shard"):
        check_target_folder(str(folder), "--target")
    run = tmp_path / "run"
    (run / "drafter").mkdir(parents=True)
    (run / "drafter" / "drafter_config.json").write_text("{}")
    with pytest.raises(UserError, match=r"--drafter .*run: no weights there"):
        check_drafter_folder(str(run), "--drafter")
