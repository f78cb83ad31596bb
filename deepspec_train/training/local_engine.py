"""The default drafter engine (``train.distributed=ddp``): every drafter rank holds the whole drafter and its
torch AdamW, accumulates gradients locally, and one flat all-reduce per step sums them over the drafter ranks.

An engine is what the trainer drives each optimizer step (``plan_step`` -> ``backward`` per micro-batch ->
``step``); ``training.deepspeed_engine`` implements the same interface over ZeRO-2, so the training loop never
asks which one it has. Ranks may run different numbers of packed micro-batches per step: this engine needs no
equal backward counts (``plan_step`` asks for no padding calls), which rules out DDP's per-backward hooks; the
flat all-reduce after accumulation costs the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.training.checkpoint import LocalTrainState, TrainState
from deepspec_train.training.distributed import DistContext, all_reduce_gradients


class DrafterEngine(Protocol):
    """What the trainer needs of an engine; ``forward_module`` is what forwards (it may wrap the drafter)."""

    forward_module: nn.Module
    # torch autocast to bf16 around forwards (DeepSpeed's bf16 instead keeps a bf16 module of its own).
    autocast_bf16: bool

    def plan_step(self, local_calls: int) -> int:
        """Agree on this step's backward calls; returns how many zero-loss padding calls this rank must add."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float:
        """Synchronise, clip and apply the step's gradients; returns the pre-clip gradient norm."""
        ...

    def train_state(self) -> TrainState: ...

    def finish(self) -> None:
        """Leave the drafter module holding its final fp32 weights (for the trained-drafter files)."""
        ...


class LocalEngine:
    """The DDP path: plain backward, one flat gradient all-reduce, torch clipping and AdamW step."""

    def __init__(self, cfg: RecipeConfig, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext):
        self.forward_module = module
        self.module = module
        self.optimizer = optimizer
        self.ctx = ctx
        self.grad_clip = cfg.train.grad_clip
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.autocast_bf16 = cfg.train.mixed_precision == "bf16" and ctx.device.type == "cuda"

    def plan_step(self, local_calls: int) -> int:
        return 0

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        all_reduce_gradients(self.params, self.ctx)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def train_state(self) -> TrainState:
        return LocalTrainState(self.module, self.optimizer)

    def finish(self) -> None:
        """Nothing to do: the module's own parameters are the fp32 weights."""


def make_engine(
    cfg: RecipeConfig, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext, run_dir: Path
) -> DrafterEngine:
    """The engine ``train.distributed`` names. Collective over the drafter ranks (DeepSpeed's initialisation)."""
    if cfg.train.distributed == "deepspeed":
        from deepspec_train.training.deepspeed_engine import DeepSpeedDrafterEngine

        return DeepSpeedDrafterEngine(cfg, module, optimizer, ctx, run_dir)
    return LocalEngine(cfg, module, optimizer, ctx)
