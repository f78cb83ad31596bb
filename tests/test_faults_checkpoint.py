"""Fault matrix, checkpoints: damaged checkpoint files are found by their manifest and never block or poison a
resume.

The unit tests write real checkpoints with ``save_checkpoint`` (a small module, AdamW, one process) and damage
their files the way crashes and disks do: a truncated safetensors ("invalid header length"), one flipped byte
in the optimizer state (which ``torch.load`` reads back without complaint), a missing RNG file, an unreadable
manifest, an empty directory. The end-to-end test does the same to a real training run through ``train.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from deepspec_train.common.errors import UserError
from deepspec_train.training import checkpoint as checkpoint_module
from deepspec_train.training.checkpoint import (
    LocalTrainState, list_checkpoints, load_checkpoint, load_run_state, resolve_resume, save_checkpoint,
)
from deepspec_train.training.checkpoint_manifest import MANIFEST_FILE, checkpoint_problem
from deepspec_train.training.distributed import DistContext
from tests.helpers.streaming_world import REPO, rank_env, recipe_overrides

CTX = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), group=None)


def training_state() -> tuple[nn.Module, LocalTrainState, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, LocalTrainState(model, optimizer), scheduler


def write_checkpoints(out: Path, steps: tuple[int, ...] = (2, 4, 6)) -> list[Path]:
    _, state, scheduler = training_state()
    for step in steps:
        save_checkpoint(CTX, out, step, state, scheduler, {"epoch": 0, "step_in_epoch": step}, keep_last=10)
    return list_checkpoints(out)


@pytest.fixture
def warnings():
    """Warnings logged by the checkpoint module (its logger prints on its own handler, not to the root)."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("deepspec_train.checkpoint")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def truncate(path: Path, size: int = 50) -> None:
    path.write_bytes(path.read_bytes()[:size])


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_manifest_lists_every_file_with_its_size_and_sha256(tmp_path) -> None:
    (checkpoint,) = write_checkpoints(tmp_path, steps=(3,))
    manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
    files = sorted(p.name for p in checkpoint.iterdir() if p.name != MANIFEST_FILE)
    assert files == ["drafter.safetensors", "optimizer.pt", "rng_rank0.pt", "trainer_state.json"]
    assert sorted(manifest["files"]) == files
    for name in files:
        data = (checkpoint / name).read_bytes()
        assert manifest["files"][name] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert not list(tmp_path.glob("checkpoints/.tmp_*")), "the manifest is written inside the atomic rename"


DAMAGE = {
    "truncated safetensors": (lambda c: truncate(c / "drafter.safetensors"), "drafter.safetensors has 50 bytes"),
    "flipped optimizer byte": (lambda c: flip_a_byte(c / "optimizer.pt"), "optimizer.pt does not match its sha256"),
    "missing rng file": (lambda c: (c / "rng_rank0.pt").unlink(), "rng_rank0.pt is missing"),
    "unreadable manifest": (lambda c: (c / MANIFEST_FILE).write_text("{not json"), "manifest.json is unreadable"),
    "empty directory": (lambda c: [p.unlink() for p in c.iterdir()], "drafter.safetensors is missing"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_auto_resume_falls_back_to_the_newest_valid_checkpoint(tmp_path, warnings, damage) -> None:
    older, previous, newest = write_checkpoints(tmp_path)
    harm, expected = DAMAGE[damage]
    harm(newest)
    assert resolve_resume("auto", tmp_path) == previous
    (warning,) = warnings
    assert f"skipping checkpoint {newest.name}" in warning and expected in warning, warning


def test_auto_resume_fails_with_one_line_when_no_checkpoint_is_valid(tmp_path) -> None:
    first, second = write_checkpoints(tmp_path, steps=(2, 4))
    truncate(first / "drafter.safetensors")
    flip_a_byte(second / "optimizer.pt")
    with pytest.raises(UserError) as caught:
        resolve_resume("auto", tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "no valid checkpoint" in message, message
    assert f"{first.name}: {first / 'drafter.safetensors'} has 50 bytes" in message, message
    assert f"{second.name}: {second / 'optimizer.pt'} does not match" in message, message
    assert resolve_resume("auto", tmp_path / "fresh") is None


def test_explicit_resume_of_a_damaged_checkpoint_names_the_file(tmp_path) -> None:
    (checkpoint,) = write_checkpoints(tmp_path, steps=(2,))
    assert resolve_resume(str(checkpoint), tmp_path) == checkpoint
    flip_a_byte(checkpoint / "drafter.safetensors")
    with pytest.raises(UserError, match=f"train.resume={checkpoint}: .*{checkpoint / 'drafter.safetensors'} does not"):
        resolve_resume(str(checkpoint), tmp_path)
    with pytest.raises(UserError, match="train.resume=bogus: no such checkpoint directory"):
        resolve_resume("bogus", tmp_path)


def test_checkpoint_without_manifest_is_accepted_with_a_warning(tmp_path, warnings) -> None:
    """The documented policy for checkpoints written before manifests: accepted unverified, with a warning; a
    damaged file in one fails when it is loaded, as one line naming it."""
    old, new = write_checkpoints(tmp_path, steps=(2, 4))
    for checkpoint in (old, new):
        (checkpoint / MANIFEST_FILE).unlink()
    (new / "optimizer.pt").unlink()
    assert resolve_resume("auto", tmp_path) == old
    assert "optimizer.pt is missing" in warnings[0] and "has no manifest" in warnings[1], warnings
    model, state, scheduler = training_state()
    run_state = load_run_state(CTX, old)
    truncate(old / "drafter.safetensors")
    with pytest.raises(UserError, match=f"{old / 'drafter.safetensors'} cannot be read: .*invalid header length"):
        load_checkpoint(CTX, old, model, state, scheduler, run_state)


class Killed(BaseException):
    """What a SIGKILL does to the deleting process, in the one place it matters: between two files."""


@pytest.mark.parametrize("keep_last", [1, 0])
def test_a_kill_while_an_old_checkpoint_is_deleted_leaves_only_whole_ones(tmp_path, monkeypatch, keep_last) -> None:
    """Rotation (``keep_last=1``) and a rerun's overwrite of the same step (``keep_last=0`` keeps everything) delete
    a whole checkpoint; a kill after its first file must not leave the rest under a ``step_*`` name."""
    write_checkpoints(tmp_path, steps=(2,))
    real_rmtree = shutil.rmtree

    def killed_after_one_file(path, ignore_errors=False):
        first = sorted(p for p in Path(path).iterdir())[0] if Path(path).is_dir() else None
        if first is None:
            return real_rmtree(path, ignore_errors=ignore_errors)
        first.unlink()
        raise Killed

    _, state, scheduler = training_state()
    step = 4 if keep_last else 2
    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", killed_after_one_file)
    with pytest.raises(Killed):
        save_checkpoint(CTX, tmp_path, step, state, scheduler, {"epoch": 0, "step_in_epoch": step}, keep_last=keep_last)
    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", real_rmtree)
    kept = list_checkpoints(tmp_path)
    assert kept and all(checkpoint_problem(path) is None for path in kept), kept
    # The next save removes the leftover.
    save_checkpoint(CTX, tmp_path, 6, state, scheduler, {"epoch": 0, "step_in_epoch": 6}, keep_last=1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000006"]


def test_verified_checkpoint_restores_the_saved_state(tmp_path) -> None:
    (checkpoint,) = write_checkpoints(tmp_path, steps=(5,))
    saved_model, saved_state, _ = training_state()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    path = resolve_resume("auto", tmp_path)
    load_checkpoint(CTX, path, model, LocalTrainState(model, optimizer), scheduler, load_run_state(CTX, path))
    for restored, saved in zip(model.parameters(), saved_model.parameters()):
        assert torch.equal(restored, saved)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved_state.optimizer.state_dict()["state"][0]["exp_avg"])


# ------------------------------------------------------------------------------------- through train.py


def train(args: list[str], log: Path) -> subprocess.CompletedProcess:
    env = rank_env(0, 1, 0) | {"WORLD_SIZE": "1"}
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    log.write_text(proc.stdout + proc.stderr)
    return proc


def losses_in_order(output_dir: Path, name: str = "metrics.jsonl") -> list[tuple[int, float]]:
    lines = (output_dir / name).read_text().splitlines()
    return [(r["step"], r["train/loss"]) for r in map(json.loads, lines) if "train/loss" in r]


@pytest.mark.slow
def test_train_resumes_past_a_corrupt_checkpoint_and_refuses_an_explicit_one(streaming_world, tmp_path) -> None:
    out = tmp_path / "run"
    common = {"train.max_steps": 4, "train.checkpoint_every": 2, "train.keep_last": 3, "train.eval_every": 1000}
    first = train(recipe_overrides(streaming_world, out, **common), tmp_path / "first.log")
    assert first.returncode == 0, first.stderr
    assert [p.name for p in list_checkpoints(out)] == ["step_00000002", "step_00000004"]
    newest = out / "checkpoints" / "step_00000004"
    truncate(newest / "drafter.safetensors")

    resumed = train(recipe_overrides(streaming_world, out, **common, **{"train.resume": "auto"}), tmp_path / "2.log")
    assert resumed.returncode == 0, resumed.stderr
    assert f"skipping checkpoint step_00000004: {newest / 'drafter.safetensors'} has 50 bytes" in resumed.stderr
    assert f"resumed from {out / 'checkpoints' / 'step_00000002'} at step 2" in resumed.stderr, resumed.stderr
    # Steps 3 and 4 again, from the step-2 checkpoint: exactly the losses of the first run. The log holds each
    # step once; the first run's records of steps 3 and 4 are kept aside, not lost.
    history, superseded = losses_in_order(out), losses_in_order(out, "metrics.superseded.jsonl")
    assert [step for step, _ in history] == [1, 2, 3, 4]
    assert superseded == history[2:4]

    flip_a_byte(newest / "optimizer.pt")
    explicit = {"train.resume": str(newest), "train.max_steps": 6}
    refused = train(recipe_overrides(streaming_world, out, **common | explicit), tmp_path / "3.log")
    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last == f"error: train.resume={newest}: cannot resume from this checkpoint: {newest / 'optimizer.pt'} " \
                   "does not match its sha256 checksum (corrupted)", refused.stderr
    assert "Traceback" not in refused.stderr
