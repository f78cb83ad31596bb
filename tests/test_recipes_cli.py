"""``deepspec recipes list|show|copy``, run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from deepspec_train.config.loader import available_recipes, config_to_dict, find_recipe, read_recipe
from tests.helpers.checkable_target import write_chat_rows, write_checkable_target

REPO = Path(__file__).resolve().parents[1]


def recipes(*argv: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deepspec_train.commands.dispatch", "recipes", *argv],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def test_list_describes_every_recipe_on_one_line() -> None:
    proc = recipes("list")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    assert sorted(lines) == available_recipes() and len(proc.stdout.splitlines()) == len(lines)
    assert lines["tiny-dspark"] == ["dspark", "target", "artifacts/tinyworld/target", "length", "512"]
    assert lines["qwen3-8b-eagle3"][0] == "eagle3" and lines["qwen3-8b-dflash"][0] == "dflash"
    assert lines["qwen3-8b-32k"][-2:] == ["length", "32768"]


def test_list_names_a_recipe_that_does_not_load_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("drafter:\n  nm_layers: 2\n")
    proc = recipes("list", env={**os.environ, "DEEPSPEC_RECIPES": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    broken = [line for line in proc.stdout.splitlines() if line.startswith("broken ")]
    assert len(broken) == 1 and "does not load" in broken[0] and "drafter.nm_layers" in broken[0]
    assert any(line.startswith("tiny-dspark ") for line in proc.stdout.splitlines())


def test_show_prints_the_resolved_recipe_after_the_file_it_came_from() -> None:
    proc = recipes("show", "qwen3-8b-dflash")
    assert proc.returncode == 0, proc.stderr
    first, rest = proc.stdout.split("\n", 1)
    path, cfg = read_recipe("qwen3-8b-dflash")
    assert first == f"# {path.resolve()}"
    # Its base (qwen3-8b) merged and every default filled in.
    assert yaml.safe_load(rest) == config_to_dict(cfg) and "base" not in yaml.safe_load(rest)


def test_show_refuses_an_unknown_recipe_in_one_line() -> None:
    proc = recipes("show", "qwen3-8b-dflsh")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: unknown recipe 'qwen3-8b-dflsh' (did you mean 'qwen3-8b-dflash'?)")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_copy_writes_the_file_to_edit_and_never_replaces_one(tmp_path: Path) -> None:
    proc = recipes("copy", "tiny-dspark", "--out", "mine.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    copied = tmp_path / "mine.yaml"
    assert copied.read_text() == find_recipe("tiny-dspark").read_text()
    copied.write_text(copied.read_text().replace("num_layers: 5", "num_layers: 2"))
    edited = copied.read_text()
    proc = recipes("copy", "tiny-dflash", "--out", "mine.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: --out mine.yaml already exists; copy to another file or remove it first")
    assert copied.read_text() == edited
    proc = recipes("copy", "tiny-dflash", "--out", "mine.txt", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "mine.txt").exists()
    # The copy is a recipe train.py reads, edits included.
    target = write_checkable_target(tmp_path / "target")
    rows = write_chat_rows(tmp_path / "train.jsonl")
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), "recipe=mine.yaml", f"target.path={target}",
                           f"data.train=[{rows}]", "data.validation=[]", "--dry-run"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["drafter"]["num_layers"] == 2
