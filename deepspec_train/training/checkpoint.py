"""Training checkpoints: written atomically, the last ``keep_last`` kept, resumable with ``train.resume=auto``.

Layout of ``<output_dir>/checkpoints/step_XXXXXXXX/``: ``drafter.safetensors`` (trainable weights only, fp32;
the frozen embedding / LM head come back from the target), ``optimizer.pt`` (a ``torch.optim.AdamW`` state dict
over the trainable parameters in ``named_parameters`` order) and ``rng_rank{r}.pt`` (tensors only, read back with
``weights_only=True``), ``trainer_state.json`` (step, scheduler, data position). A checkpoint is written to a
temporary directory and renamed into place, so a crash never leaves a half-written one under the final name.

The weights and optimizer state come from a ``TrainState``: ``LocalTrainState`` for the DDP path (every rank
holds everything) or the DeepSpeed engine's, which gathers ZeRO's partitions into the same full layout. Both
write identical files, so a run may resume under the other engine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional, Protocol

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from deepspec_train.formats.trained_drafter import trainable_state
from deepspec_train.training.distributed import DistContext, barrier

PREFIX = "step_"


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
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "trainer_state.json").is_file())


def resolve_resume(resume: str, output_dir: str | Path) -> Optional[Path]:
    """``none`` -> None; ``auto`` -> the latest checkpoint if any; otherwise a checkpoint path that must exist."""
    if resume == "none":
        return None
    if resume == "auto":
        found = list_checkpoints(output_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"train.resume={resume}: no checkpoint there (expected trainer_state.json)")
    return path


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
        tmp.mkdir(parents=True)
    barrier(ctx)
    torch.save({"cpu": torch.get_rng_state(), **_cuda_rng()}, tmp / f"rng_rank{ctx.rank}.pt")
    # Gathering may be collective (ZeRO partitions), so every rank asks; only the main rank gets the full state.
    weights, optimizer_state = train_state.trainable_weights(), train_state.optimizer_state()
    if ctx.is_main:
        save_file(weights, str(tmp / "drafter.safetensors"))
        torch.save(optimizer_state, tmp / "optimizer.pt")
        state = {"step": step, "scheduler": scheduler.state_dict(), "data": data_state, "world_size": ctx.world_size}
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, default=_json_default))
    barrier(ctx)
    if ctx.is_main:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in list_checkpoints(output_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(ctx)
    return final


def load_run_state(ctx: DistContext, path: Path) -> dict:
    """The trainer state (step, scheduler, data position) and this rank's RNG, restored without any collective,
    so a streamed drafter can position its data before the drafter ranks first synchronise."""
    state = json.loads((path / "trainer_state.json").read_text())
    if state["world_size"] != ctx.world_size:
        raise ValueError(f"{path} was written by {state['world_size']} ranks; this run has {ctx.world_size}")
    rng = torch.load(path / f"rng_rank{ctx.rank}.pt", weights_only=True)
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
    weights = load_file(str(path / "drafter.safetensors"), device=str(ctx.device))
    missing = set(trainable_state(model)) - set(weights)
    if missing:
        raise KeyError(f"{path}: checkpoint lacks trainable weights {sorted(missing)[:5]}")
    train_state.load_trainable_weights(weights)
    train_state.load_optimizer_state(torch.load(path / "optimizer.pt", map_location=ctx.device, weights_only=True))
    scheduler.load_state_dict(run_state["scheduler"])


def _cuda_rng() -> dict:
    return {"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_available() else {}


def _json_default(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")
