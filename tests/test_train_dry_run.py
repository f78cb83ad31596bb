"""``train.py ... --dry-run`` and ``deepspec train ... --dry-run``: the run's own validation, then the resolved config
as YAML, with nothing heavy loaded (torch stays out) and nothing left on disk; and ``train.py --help``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deepspec_train.config.loader import config_to_dict
from deepspec_train.errors import UserError
from deepspec_train.output_paths import check_output_dir
from deepspec_train.validation import load_recipe
from tests.helpers.config_only_target import write_config_only_target

REPO = Path(__file__).resolve().parents[1]
# Runs train.py's entry and reports on stderr whether torch was imported, keeping stdout for the YAML.
PROBE = (
    "import sys; from deepspec_train.jobs.entry import main; code = main(sys.argv[1:]); "
    "sys.stderr.write('torch imported' if 'torch' in sys.modules else 'torch not imported'); sys.exit(code)"
)


def run(argv: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture
def overrides(tmp_path: Path) -> list[str]:
    target = write_config_only_target(tmp_path / "target")
    return [
        f"target.path={target}", f"run.output_dir={tmp_path / 'runs' / 'a'}", f"data.cache_dir={tmp_path / 'cache'}",
    ]


def test_dry_run_prints_the_resolved_config_without_torch_and_leaves_no_folder(overrides, tmp_path: Path) -> None:
    argv = ["recipe=tiny-dspark", *overrides, "train.lr=1e-3", "drafter.num_layers=2", "--dry-run"]
    proc = run([sys.executable, "-c", PROBE, *argv])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "torch not imported"
    printed = yaml.safe_load(proc.stdout)
    assert printed == config_to_dict(load_recipe("tiny-dspark", argv[1:-1]))
    assert printed["train"]["lr"] == 1e-3 and printed["drafter"]["num_layers"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_deepspec_train_dry_run_prints_what_train_py_prints(overrides) -> None:
    expected = run([sys.executable, "train.py", "recipe=tiny-eagle3", *overrides, "--dry-run"])
    assert expected.returncode == 0, expected.stderr
    for argv in (["--dry-run", "recipe=tiny-eagle3", *overrides], ["recipe=tiny-eagle3", "--dry-run", *overrides]):
        proc = run([sys.executable, "-m", "deepspec_train.jobs.cli", "train", *argv])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == expected.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["train.max_steps=-5"], "train.max_steps = -5 must be >= 1"),
        (["drafter.nm_layers=2"], "unknown key 'drafter.nm_layers'"),
        (["target.layer_ids=[1,4]"], "target.layer_ids = [1, 4]: the target has 5 decoder layers"),
        (["train.distributed=deepspeed", "train.deepspeed_config=launch/deepspeed/none.json"], "no such file"),
    ],
    ids=["rule", "unknown key", "target rule", "deepspeed config"],
)
def test_dry_run_refuses_what_a_run_refuses_in_one_line(overrides, extra: list[str], message: str) -> None:
    proc = run([sys.executable, "train.py", "recipe=tiny-dspark", *overrides, *extra, "--dry-run"])
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr


def test_dry_run_checks_the_output_folder_as_a_run_does(overrides, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    proc = run([sys.executable, "train.py", "recipe=tiny-dspark", *overrides, f"run.output_dir={blocker / 'run'}",
                "--dry-run"])
    assert proc.returncode == 2
    reason = f"cannot write there: a file stands where a folder must be ({blocker})"
    assert proc.stderr.strip() == f"error: run.output_dir {blocker / 'run'}: {reason}"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "metrics.jsonl").write_text("{}\n")
    proc = run([sys.executable, "train.py", "recipe=tiny-dspark", *overrides, f"run.output_dir={taken}", "--dry-run"])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "already" in proc.stderr


def test_check_output_dir_probes_the_nearest_existing_folder_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    assert check_output_dir(tmp_path / "a" / "b", "run.output_dir") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="a file stands where a folder must be"):
        check_output_dir(tmp_path / "f" / "run", "run.output_dir")


@pytest.mark.parametrize("argv", [["train.py", "--help"], ["train.py", "recipe=tiny-dspark", "-h"]])
def test_train_py_help_gives_usage_recipes_and_where_keys_are_documented(argv: list[str]) -> None:
    proc = run([sys.executable, *argv])
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: train.py recipe=NAME [dotted.key=value ...] [--dry-run]")
    assert "--dry-run" in proc.stdout.split("\n\n")[2]
    assert all(name in proc.stdout for name in ("tiny-dspark", "qwen3-8b-eagle3", "docs/reference/recipe_keys.md"))
