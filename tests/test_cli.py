"""The `deepspec` console script: every verb is wired and answers --help; bad verbs fail; `--version`, `env`, and
`--help` of the other entry points (train.py, ``python -m deepspec_train.costs``) exit 0."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

import deepspec_train.common.package_version as package_version_module
from deepspec_train.commands.dispatch import VERBS, main
from deepspec_train.commands.env import LIBRARIES, NOT_INSTALLED, format_report, installed_version
from deepspec_train.common.package_version import package_version

REPO = Path(__file__).resolve().parents[1]


def test_unknown_verb_fails(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-verb"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_has_help(verb: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deepspec_train.commands.dispatch", verb, "--help"], capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"deepspec {verb}" in proc.stdout


def deepspec(*argv: str) -> subprocess.CompletedProcess:
    """``deepspec ARGV`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "deepspec_train.commands.dispatch", *argv], capture_output=True, text=True, timeout=120,
        cwd=REPO,
    )


def test_help_exits_zero_and_no_verb_exits_two_with_usage() -> None:
    for argv in (["--help"], ["-h"]):
        proc = deepspec(*argv)
        assert proc.returncode == 0 and proc.stdout.startswith("usage: deepspec") and proc.stderr == "", argv
        assert all(verb in proc.stdout for verb in VERBS)
    proc = deepspec()
    assert proc.returncode == 2 and proc.stderr.startswith("usage: deepspec")


def test_version_is_the_package_version() -> None:
    proc = deepspec("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"deepspec_train {metadata.version('deepspec_train')}"


def test_the_version_falls_back_to_pyproject_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(package_version_module.metadata, "version", not_installed)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'\nversion = "{package_version()}"\n' in pyproject


@pytest.mark.parametrize(
    "command",
    [["train.py", "--help"], ["train.py", "-h"], ["-m", "deepspec_train.costs", "--help"]],
    ids=["train.py --help", "train.py -h", "sizing --help"],
)
def test_help_of_the_other_entry_points_exits_zero(command: list[str]) -> None:
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:") and "error" not in proc.stderr


def test_sizing_refuses_an_unknown_option_before_working() -> None:
    proc = subprocess.run([sys.executable, "-m", "deepspec_train.costs", "--bogus"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr and proc.stdout == ""


def test_env_reports_the_installed_versions_and_cuda_as_json() -> None:
    proc = deepspec("env", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["deepspec_train"] == metadata.version("deepspec_train")
    assert report["python"] == platform.python_version() and report["platform"] == platform.platform()
    assert set(report["libraries"]) == {
        "torch", "transformers", "accelerate", "deepspeed", "tokenizers", "safetensors"}
    for name, version in report["libraries"].items():
        assert version == installed_version(name)
    assert report["libraries"]["torch"] == metadata.version("torch")
    assert report["cuda"]["available"] == torch.cuda.is_available()
    assert report["cuda"]["version"] == torch.version.cuda
    assert len(report["cuda"]["devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_env_prints_one_aligned_line_per_item() -> None:
    proc = deepspec("env")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    names = ["deepspec_train", "python", *LIBRARIES, "CUDA available", "CUDA version", "devices", "platform"]
    assert [line[: len(name)] for line, name in zip(lines, names)] == names and len(lines) == len(names)
    column = max(len(name) for name in names) + 2
    assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines), proc.stdout


def test_env_report_text_names_missing_libraries_and_devices() -> None:
    assert installed_version("surely-no-such-distribution") == NOT_INSTALLED
    report = {
        "deepspec_train": "0.1.0", "python": "3.11.7", "platform": "Linux",
        "libraries": {"torch": "2.13.0", "deepspeed": NOT_INSTALLED},
        "cuda": {"available": True, "version": "12.8", "devices": ["NVIDIA H100", "NVIDIA H100"]},
    }
    text = format_report(report)
    assert "deepspeed       not installed" in text
    assert "CUDA available  yes" in text and "CUDA version    12.8" in text
    assert "devices         0: NVIDIA H100, 1: NVIDIA H100" in text
