"""A plain (not editable) install of the wheel finds its recipes and DeepSpeed config in the installed package.

The wheel is built offline from a copy of the source tree (so the checkout gets no build/ folder), installed with
``--no-deps`` into a fresh virtual environment outside the checkout, which borrows the dependencies (torch, ...)
from the test's own environment through a ``.pth`` line instead of downloading them, and ``deepspec`` is run from
a folder outside the checkout. The checkout's own editable install is a ``.pth`` hook that such a line does not
run, so nothing of the checkout can be imported there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from tests.helpers.checkable_target import write_chat_rows, write_checkable_target

REPO = Path(__file__).resolve().parents[1]
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "tests", "artifacts", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    "wandb",
)


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{argv}: {proc.stderr}"
    return proc


@pytest.mark.slow
def test_the_installed_wheel_finds_its_recipes_outside_the_checkout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEEPSPEC_RECIPES", "VIRTUAL_ENV")}
    source = tmp_path / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=NOT_SOURCE)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    wheels = tmp_path / "wheel"
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", str(source), "-w", str(wheels)],
        tmp_path, env)
    (wheel,) = wheels.glob("deepspec_train-*.whl")
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("deepspec_train/shipped/")}
    assert "deepspec_train/shipped/recipes/tiny-dspark.yaml" in shipped
    assert "deepspec_train/shipped/launch/deepspeed/zero2.json" in shipped
    assert "deepspec_train/shipped/prompts/LICENSE-gsm8k" in shipped

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path, env)
                .stdout.strip())
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], tmp_path, env)

    work = tmp_path / "work"
    work.mkdir()
    deepspec = str(venv / "bin" / "deepspec")
    where = run([str(python), "-c", "import deepspec_train; print(deepspec_train.__file__)"], work, env).stdout
    assert Path(where.strip()).is_relative_to(site)
    listing = run([deepspec, "recipes", "list"], work, env).stdout.splitlines()
    assert any(line.split()[:2] == ["tiny-dspark", "dspark"] for line in listing)
    assert any(line.split()[:2] == ["qwen3-8b-eagle3", "eagle3"] for line in listing)
    shown = run([deepspec, "recipes", "show", "tiny-dspark"], work, env).stdout
    assert shown.splitlines()[0] == f"# {site / 'deepspec_train' / 'shipped' / 'recipes' / 'tiny-dspark.yaml'}"
    # The built-in prompt set of the tutorial's laptop path comes from the package as well.
    prompts = run([deepspec, "realworld", "prompts", "--source", "builtin:gsm8k-train", "--out",
                   str(tmp_path / "prompts"), "--train", "4", "--validation", "0"], work, env).stdout
    assert "4 train, 0 validation prompts" in prompts
    # The whole validation, the DeepSpeed config included: it must come from the package too.
    target = write_checkable_target(tmp_path / "target")
    rows = write_chat_rows(tmp_path / "train.jsonl")
    dry_run = run([deepspec, "train", "recipe=tiny-dspark", f"target.path={target}", f"data.train=[{rows}]",
                   "data.validation=[]", "train.distributed=deepspeed", "--dry-run"], work, env).stdout
    resolved = yaml.safe_load(dry_run)
    assert resolved["train"]["distributed"] == "deepspeed" and resolved["target"]["path"] == str(target)
    assert sorted(p.name for p in work.iterdir()) == []
    version = run([deepspec, "--version"], work, env).stdout.strip()
    assert version == f"deepspec_train {metadata.version('deepspec_train')}"
