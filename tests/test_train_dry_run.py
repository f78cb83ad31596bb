"""``train.py ... --dry-run`` and ``deepspec train ... --dry-run``: the run's own validation and what it reads first
(the data sources' first rows, the target's config.json, tokenizer and weight headers: ``jobs.preflight``), then
the resolved config as YAML with the findings as comments, exit 0 only when a real run would start, nothing left on
disk; and ``train.py --help``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deepspec_train.config.loader import config_to_dict
from deepspec_train.common.errors import UserError
from deepspec_train.common.output_paths import check_output_dir
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.checkable_target import write_chat_rows, write_checkable_target

REPO = Path(__file__).resolve().parents[1]
# Runs train.py's entry and reports on stderr whether torch was imported, keeping stdout for the YAML.
PROBE = (
    "import sys; from deepspec_train.commands.train_entry import main; code = main(sys.argv[1:]); "
    "sys.stderr.write('torch imported' if 'torch' in sys.modules else 'torch not imported'); sys.exit(code)"
)


def run(argv: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture
def overrides(tmp_path: Path) -> list[str]:
    target = write_checkable_target(tmp_path / "target")
    rows = write_chat_rows(tmp_path / "train.jsonl")
    return [
        f"target.path={target}", f"data.train=[{rows}]", "data.validation=[]",
        f"run.output_dir={tmp_path / 'runs' / 'a'}", f"data.cache_dir={tmp_path / 'cache'}",
    ]


def test_dry_run_prints_the_resolved_config_and_what_it_read_and_leaves_no_folder(overrides, tmp_path: Path) -> None:
    argv = ["recipe=tiny-dspark", *overrides, "train.lr=1e-3", "drafter.num_layers=2", "--dry-run"]
    proc = run([sys.executable, "train.py", *argv])
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed == config_to_dict(load_recipe("tiny-dspark", argv[1:-1]))
    assert printed["train"]["lr"] == 1e-3 and printed["drafter"]["num_layers"] == 2
    findings = proc.stdout.split("# dry run: what the run reads before it starts\n")[1].splitlines()
    assert findings == [
        f"#   ok           target.path {tmp_path / 'target'}: config.json and weights (headers) readable",
        f"#   ok           data.train {tmp_path / 'train.jsonl'}: readable, chat rows (detected)",
        f"#   ok           target.path {tmp_path / 'target'}: tokenizer loads",
        "# would a real run start: yes",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target", "train.jsonl"]


def test_dry_run_without_the_target_folder_prints_the_config_and_says_what_stops_the_run(tmp_path: Path) -> None:
    """The README's line, on a machine without the 16 GB model: the config, what was not checked, status 2."""
    proc = run([sys.executable, "-c", PROBE, "recipe=qwen3-8b", "train.lr=3e-4", "--dry-run"], cwd=tmp_path)
    assert proc.returncode == 2
    assert yaml.safe_load(proc.stdout)["target"]["path"] == "models/Qwen3-8B"
    stops = [line for line in proc.stdout.splitlines() if line.startswith("#   stops")]
    assert stops[0].endswith("target.path models/Qwen3-8B: target folder not found: its config.json, tokenizer and "
                             "weights not checked")
    assert any(line.endswith("data source 'data/open-perfectblend/qwen3-8b/train.jsonl': no such file or directory "
                             "(data.train)") for line in stops)
    assert proc.stdout.rstrip().endswith("# would a real run start: no: the lines marked 'stops' stop it")
    error, probe = proc.stderr.strip().splitlines()
    assert error.startswith("error: the run would not start: target.path models/Qwen3-8B: target folder not found")
    assert error.endswith(f"(and {len(stops) - 1} more, listed above)")
    # Only the recipe and the files were read: no model stack, and nothing written.
    assert probe == "torch not imported" and list(tmp_path.iterdir()) == []


DATA_FAULTS = {
    "missing": (lambda d: d / "nowhere.jsonl", "no such file or directory"),
    "csv": (lambda d: write_bytes(d / "chat.csv", b"prompt,answer\nhi,hello\n"), "unsupported file type '.csv'"),
    "empty": (lambda d: write_bytes(d / "empty.jsonl", b""), "is empty: it holds no rows"),
    "no shape": (lambda d: write_bytes(d / "odd.jsonl", b'{"foo": 1}\n'), "none of its first 32 rows has a row shape"),
}


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("fault", sorted(DATA_FAULTS))
def test_dry_run_reads_the_data_sources_first_rows(overrides, tmp_path: Path, fault: str) -> None:
    make, reason = DATA_FAULTS[fault]
    source = make(tmp_path)
    proc = run([sys.executable, "train.py", "recipe=tiny-dspark", *overrides, f"data.train=[{source}]", "--dry-run"])
    assert proc.returncode == 2 and yaml.safe_load(proc.stdout)["data"]["train"] == [str(source)]
    (stop,) = [line for line in proc.stdout.splitlines() if line.startswith("#   stops")]
    assert str(source) in stop and reason in stop
    assert proc.stderr.strip() == "error: the run would not start: " + stop.split("stops", 1)[1].strip()
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_deepspec_train_dry_run_prints_what_train_py_prints(overrides) -> None:
    expected = run([sys.executable, "train.py", "recipe=tiny-eagle3", *overrides, "--dry-run"])
    assert expected.returncode == 0, expected.stderr
    for argv in (["--dry-run", "recipe=tiny-eagle3", *overrides], ["recipe=tiny-eagle3", "--dry-run", *overrides]):
        proc = run([sys.executable, "-m", "deepspec_train.commands.dispatch", "train", *argv])
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
