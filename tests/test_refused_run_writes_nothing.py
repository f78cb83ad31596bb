"""A refused training run writes nothing: its checks run before ``run.output_dir`` and ``data.cache_dir`` are
created (``jobs.preflight``), and a refusal met once the run has started removes the run folder it created
(``jobs.refusal_cleanup``), never one that existed before. Run as a user runs ``train.py`` (a subprocess)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepspec_train.common.errors import UserError
from deepspec_train.jobs.refusal_cleanup import highest_missing, removed_if_refused
from deepspec_train.jobs.run_directory import holds_a_run
from tests.helpers.checkable_target import CHAT_ROW, write_checkable_target
from tests.helpers.streaming_world import REPO, rank_env, recipe_overrides


def train(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = rank_env(0, 1, 0) | {"WORLD_SIZE": "1"}
    return subprocess.run([sys.executable, str(REPO / "train.py"), *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


SOURCES = {
    "missing": (lambda d: d / "nowhere.jsonl", "no such file or directory"),
    "empty": (lambda d: write(d / "empty.jsonl", b""), "is empty: it holds no rows"),
    "csv": (lambda d: write(d / "chat.csv", b"prompt,answer\nhi,hello\n"), "unsupported file type '.csv'"),
    "jsonl.gz": (lambda d: write(d / "chat.jsonl.gz", gzip.compress(str(CHAT_ROW).encode())),
                 "unsupported file type '.gz'"),
}


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("fault", sorted(SOURCES))
def test_a_refused_data_source_leaves_no_run_folder(tmp_path: Path, fault: str) -> None:
    make, reason = SOURCES[fault]
    source = make(tmp_path)
    target = write_checkable_target(tmp_path / "target")
    proc = train(["recipe=tiny-dspark", f"target.path={target}", f"data.train=[{source}]", "data.validation=[]",
                  f"run.output_dir={tmp_path / 'runs' / 'a'}", f"data.cache_dir={tmp_path / 'cache'}"], tmp_path)
    (line,) = error_lines(proc)
    assert proc.returncode == 2 and line.endswith(" (data.train)") and reason in line, proc.stderr
    assert str(source) in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_a_refusal_after_the_start_removes_the_folder_it_created_but_not_an_older_one(streaming_world,
                                                                                       tmp_path: Path) -> None:
    # The first rows pass the checks made before the run; the rest are unusable, which only tokenising finds.
    good = Path(streaming_world["train"]).read_text().splitlines()[:3]
    source = write(tmp_path / "mostly_bad.jsonl", "\n".join(good + ["{oops"] * 40).encode() + b"\n")
    overrides = {"data.train": f"[{source}]", "data.validation": "[]"}
    proc = train(recipe_overrides(streaming_world, tmp_path / "runs" / "new", **overrides), tmp_path)
    assert proc.returncode == 2 and "3 usable rows, fewer than one step's 4" in error_lines(proc)[0], proc.stderr
    assert not (tmp_path / "runs").exists()
    older = tmp_path / "older"
    older.mkdir()
    (older / "notes.txt").write_text("mine\n")
    proc = train(recipe_overrides(streaming_world, older, **overrides), tmp_path)
    assert proc.returncode == 2 and (older / "notes.txt").read_text() == "mine\n"


def test_only_a_user_error_removes_and_never_a_folder_that_holds_a_run(tmp_path: Path) -> None:
    folder = str(tmp_path / "a" / "b")
    assert highest_missing(folder) == tmp_path / "a" and highest_missing(str(tmp_path)) is None
    with pytest.raises(UserError), removed_if_refused(folder, holds_a_run):
        os.makedirs(folder)
        raise UserError("refused")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), removed_if_refused(folder, holds_a_run):
        os.makedirs(folder)
        raise RuntimeError("a bug keeps what was written")
    assert Path(folder).is_dir()
    trained = tmp_path / "trained"
    with pytest.raises(UserError), removed_if_refused(str(trained), holds_a_run):
        trained.mkdir()
        (trained / "metrics.jsonl").write_text("{}\n")
        raise UserError("disk full after some steps")
    assert (trained / "metrics.jsonl").is_file()
