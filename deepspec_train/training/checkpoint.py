"""Training checkpoints: written atomically, the last ``keep_last`` kept, resumable with ``train.resume=auto``.

Layout of ``<output_dir>/checkpoints/step_XXXXXXXX/``: ``drafter.safetensors`` (trainable weights only, fp32;
the frozen embedding / LM head come back from the target), ``optimizer.pt`` (a ``torch.optim.AdamW`` state dict
over the trainable parameters in ``named_parameters`` order) and ``rng_rank{r}.pt`` (tensors only, read back with
``weights_only=True``), ``trainer_state.json`` (step, scheduler, data position) and ``manifest.json`` (size and
SHA-256 of every other file, see ``checkpoint_manifest``). A checkpoint is written to a temporary directory and
renamed into place, manifest included, so a crash never leaves a half-written one under the final name. An old
checkpoint (rotated out, or overwritten by a rerun) is renamed out of the ``step_*`` names before it is deleted, so a
kill during the deletion never leaves a half-deleted one under a name ``train.resume=auto`` reads either.

Resuming verifies before it loads. ``train.resume=auto`` takes the newest checkpoint that passes and logs a
warning for each newer one it skipped, naming the file and what is wrong with it; when none passes it fails
with one line listing them. ``train.resume=PATH`` that does not pass fails with one line naming the file. A
checkpoint without a manifest (written before manifests existed) is accepted with a warning that it was not
verified.

The weights and optimizer state come from a ``TrainState``: ``LocalTrainState`` for the DDP path (every rank
holds everything) or the DeepSpeed engine's, which gathers ZeRO's partitions into the same full layout. Both
write identical files, so a run may resume under the other engine.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Callable, Optional, Protocol, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from deepspec_train.common.console import get_logger
from deepspec_train.common.disk_space import tensor_bytes, whole_or_nothing
from deepspec_train.common.errors import UserError
from deepspec_train.formats.trained_drafter import trainable_state
from deepspec_train.training.checkpoint_manifest import checkpoint_problem, has_manifest, write_manifest
from deepspec_train.training.distributed import DistContext, barrier

PREFIX = "step_"
_DELETING = ".deleting_"
log = get_logger("deepspec_train.checkpoint")
T = TypeVar("T")
# What reading back a damaged safetensors, torch.save or JSON file raises.
_READ_ERRORS = (OSError, ValueError, RuntimeError, EOFError, KeyError, pickle.UnpicklingError, SafetensorError)


class TrainState(Protocol):
    """What a checkpoint saves and restores of the model and optimizer. The getters may be collective (every
    drafter rank calls them); they return the full state on the main rank and may return None elsewhere."""

    def trainable_weights(self) -> Optional[dict[str, torch.Tensor]]: ...

    def optimizer_state(self) -> Optional[dict]: ...

    def load_trainable_weights(self, weights: dict[str, torch.Tensor]) -> None: ...

    def load_optimizer_state(self, state: dict) -> None: ...


class LocalTrainState:
    """A module and a plain torch optimizer that every rank holds in full (the DDP path)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer

    def trainable_weights(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.model)

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def load_trainable_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights, strict=False)

    def load_optimizer_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Every ``step_*`` directory, oldest first (step numbers are zero-padded), whether it verifies or not."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def resolve_resume(resume: str, output_dir: str | Path) -> Optional[Path]:
    """``none`` -> None; ``auto`` -> the newest checkpoint that verifies (None when there is none at all);
    otherwise a checkpoint path that must verify. See the module docstring for what is logged and raised."""
    if resume == "none":
        return None
    if resume == "auto":
        return _newest_valid_checkpoint(output_dir)
    path = Path(resume)
    if not path.is_dir():
        raise UserError(f"train.resume={resume}: no such checkpoint directory (or use auto or none)")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise UserError(f"train.resume={resume}: cannot resume from this checkpoint: {problem}")
    _warn_if_unverified(path)
    return path


def _newest_valid_checkpoint(output_dir: str | Path) -> Optional[Path]:
    skipped = []
    for candidate in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(candidate)
        if problem is None:
            _warn_if_unverified(candidate)
            return candidate
        log.warning("train.resume=auto: skipping checkpoint %s: %s", candidate.name, problem)
        skipped.append(f"{candidate.name}: {problem}")
    if skipped:
        raise UserError(
            f"train.resume=auto: no valid checkpoint in {checkpoint_dir(output_dir)} ({'; '.join(skipped)}); "
            "move them aside to start over"
        )
    return None


def _warn_if_unverified(path: Path) -> None:
    if not has_manifest(path):
        log.warning("checkpoint %s has no manifest (written by an older version): resuming without verifying it", path)


def save_checkpoint(
    ctx: DistContext,
    output_dir: str | Path,
    step: int,
    train_state: TrainState,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    data_state: dict,
    keep_last: int,
) -> Path:
    """Every rank calls this; rank 0 writes the shared files, each rank its own RNG state."""
    root = checkpoint_dir(output_dir)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp_{PREFIX}{step:08d}"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        for leftover in root.glob(f"{_DELETING}*") if root.is_dir() else []:
            shutil.rmtree(leftover, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(ctx)
    rng = {"cpu": torch.get_rng_state(), **_cuda_rng()}
    rng_file = tmp / f"rng_rank{ctx.rank}.pt"
    with whole_or_nothing(final, tensor_bytes(rng), lambda: rng_file.unlink(missing_ok=True)):
        torch.save(rng, rng_file)
    # Gathering may be collective (ZeRO partitions), so every rank asks; only the main rank gets the full state.
    weights, optimizer_state = train_state.trainable_weights(), train_state.optimizer_state()

    def discard() -> None:
        # A full disk removes the temporary directory and ends the run in one line; older checkpoints stay whole.
        shutil.rmtree(tmp, ignore_errors=True)

    if ctx.is_main:
        with whole_or_nothing(final, tensor_bytes(weights) + tensor_bytes(optimizer_state), discard):
            save_file(weights, str(tmp / "drafter.safetensors"))
            torch.save(optimizer_state, tmp / "optimizer.pt")
            state = {
                "step": step, "scheduler": scheduler.state_dict(), "data": data_state, "world_size": ctx.world_size,
            }
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, default=_json_default))
    barrier(ctx)
    if ctx.is_main:
        # After the barrier: every rank's RNG file is in place, so the manifest covers the whole checkpoint.
        with whole_or_nothing(final, 0, discard):
            write_manifest(tmp)
        # A rerun's checkpoint of the same step replaces the old one: the old is moved aside before the new is
        # renamed in, and deleted only after.
        replaced = _move_aside(final) if final.exists() else None
        tmp.rename(final)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
        for old in list_checkpoints(output_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(_move_aside(old), ignore_errors=True)
    barrier(ctx)
    return final


def _move_aside(checkpoint: Path) -> Path:
    """Rename (atomic) out of the ``step_*`` names, to be deleted; a leftover of a killed deletion goes at the next
    save."""
    doomed = checkpoint.with_name(f"{_DELETING}{checkpoint.name}")
    shutil.rmtree(doomed, ignore_errors=True)
    checkpoint.rename(doomed)
    return doomed


def checkpoint_step(path: Path) -> int:
    """The optimizer step a (verified) checkpoint was written after."""
    return int(_read(path / "trainer_state.json", lambda file: json.loads(file.read_text()))["step"])


def load_run_state(ctx: DistContext, path: Path) -> dict:
    """The trainer state (step, scheduler, data position) and this rank's RNG, restored without any collective,
    so a streamed drafter can position its data before the drafter ranks first synchronise."""
    state = _read(path / "trainer_state.json", lambda file: json.loads(file.read_text()))
    if state["world_size"] != ctx.world_size:
        raise UserError(
            f"{path} was written by {state['world_size']} drafter ranks; this run has {ctx.world_size}: resume with "
            f"the same number of drafter ranks"
        )
    rng = _read(path / f"rng_rank{ctx.rank}.pt", lambda file: torch.load(file, weights_only=True))
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return state


def load_checkpoint(
    ctx: DistContext,
    path: Path,
    model: nn.Module,
    train_state: TrainState,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    run_state: dict,
) -> None:
    """Restore weights, optimizer and scheduler (``run_state`` from ``load_run_state`` of the same checkpoint)."""
    weights = _read(path / "drafter.safetensors", lambda file: load_file(str(file), device=str(ctx.device)))
    missing = set(trainable_state(model)) - set(weights)
    if missing:
        raise UserError(
            f"{path / 'drafter.safetensors'} lacks trainable weights {sorted(missing)[:5]}: it was written for "
            "another drafter configuration"
        )
    train_state.load_trainable_weights(weights)
    optimizer = _read(path / "optimizer.pt", lambda file: torch.load(file, map_location=ctx.device, weights_only=True))
    train_state.load_optimizer_state(optimizer)
    scheduler.load_state_dict(run_state["scheduler"])


def _read(file: Path, reader: Callable[[Path], T]) -> T:
    """``reader(file)``; a file that cannot be read back (corrupt in a checkpoint without a manifest, or changed
    since it was verified) is a one-line ``UserError`` naming it."""
    try:
        return reader(file)
    except _READ_ERRORS as error:
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise UserError(f"checkpoint file {file} cannot be read: {type(error).__name__}: {first_line}") from error


def _cuda_rng() -> dict:
    return {"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_available() else {}


def _json_default(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")
