"""Fault matrix, a full disk: a checkpoint, an export or a token-cache write that runs out of space leaves no
partial file a reader would take for whole, keeps the previous checkpoint valid, and ends with one line (exit
status 2) naming the path and the bytes it needed.

The disk is a 12 MB tmpfs mounted here (root needed; skipped with the reason otherwise), with a filler file
leaving just the room each case needs: one checkpoint but not two, half an export, a few KB of token cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deepspec_train.commands.dispatch import main as deepspec_main
from deepspec_train.common.disk_space import folder_bytes
from deepspec_train.training.checkpoint import list_checkpoints
from deepspec_train.training.checkpoint_manifest import checkpoint_problem
from deepspec_train.commands.train_entry import main as train_main
from tests.helpers.streaming_world import recipe_overrides


@pytest.fixture
def small_disk(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 12 MB tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def leave_free(disk: Path, free: int) -> None:
    """Fill ``disk`` until about ``free`` bytes are left."""
    filler = shutil.disk_usage(disk).free - free
    assert filler > 0, (shutil.disk_usage(disk).free, free)
    with open(disk / "filler", "wb") as handle:
        handle.write(b"\0" * filler)


@pytest.fixture(scope="module")
def finished_run(streaming_world, tmp_path_factory) -> Path:
    """A one-step run on the ordinary disk: its checkpoint's size and its trained drafter."""
    out = tmp_path_factory.mktemp("reference") / "run"
    args = recipe_overrides(streaming_world, out, **{"train.max_steps": 1, "train.checkpoint_every": 1})
    assert train_main(args) == 0
    return out


def only_error_line(capsys: pytest.CaptureFixture) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one(streaming_world, finished_run, small_disk, capsys) -> None:
    size = folder_bytes(list_checkpoints(finished_run)[0])
    out = small_disk / "run"
    # Room for the run's small files and one checkpoint, not for the second next to it.
    leave_free(small_disk, int(1.5 * size) + 64 * 1024)
    args = recipe_overrides(streaming_world, out, **{
        "train.max_steps": 4, "train.checkpoint_every": 1, "train.keep_last": 1, "train.eval_every": 1000,
    })
    assert train_main(args) == 2
    line = only_error_line(capsys)
    assert str(out / "checkpoints" / "step_00000002") in line and "the disk is full" in line, line
    needed = int(line.split("needs ")[1].split(" bytes")[0].replace(",", ""))
    assert 0.8 * size < needed <= size, (needed, size)
    kept = list_checkpoints(out)
    assert [p.name for p in kept] == ["step_00000001"] and checkpoint_problem(kept[0]) is None
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000001"]


def test_a_full_disk_during_an_export_leaves_no_weights_file(streaming_world, finished_run, small_disk, capsys) -> None:
    weights = folder_bytes(finished_run / "drafter")
    leave_free(small_disk, weights // 4)
    out = small_disk / "export"
    status = deepspec_main(["export", "--drafter", str(finished_run / "drafter"), "--target", streaming_world["target"],
                            "--out", str(out), "--dtype", "fp32"])
    line = only_error_line(capsys)
    assert status == 2 and str(out / "model.safetensors") in line and "the disk is full" in line, line
    assert os.listdir(out) == [], os.listdir(out)


def test_a_full_disk_while_tokenising_leaves_no_cache_entry(streaming_world, small_disk, tmp_path, capsys) -> None:
    cache = small_disk / "cache"
    leave_free(small_disk, 8 * 1024)
    args = recipe_overrides(streaming_world, tmp_path / "run", **{"data.cache_dir": str(cache)})
    assert train_main(args) == 2
    line = only_error_line(capsys)
    assert str(cache) in line and "the disk is full" in line and "bytes or more" in line, line
    assert os.listdir(cache) == [], os.listdir(cache)
