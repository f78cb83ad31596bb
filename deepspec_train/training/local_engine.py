"""The default drafter engine (``train.distributed=ddp``): every drafter rank holds the whole drafter and its
torch AdamW, and torch's ``DistributedDataParallel`` sums the gradients over the drafter ranks in buckets, each
bucket's all-reduce starting during backward as soon as its gradients are ready.

An engine is what the trainer drives each optimizer step (``plan_step`` -> per micro-batch ``micro_batch()``
around forward and ``backward`` -> ``clip`` -> ``step``); ``training.deepspeed_engine`` implements the same
interface over ZeRO-2, so the training loop never asks which one it has.

Ranks may run different numbers of packed micro-batches in a step. DDP reduces inside a backward, so every
micro-batch but a rank's last runs under ``no_sync`` (gradients accumulate locally) and each rank's last backward
is the one that reduces: one reducing backward per rank per step, whatever the counts. A rank with no micro-batch
of its own in a step runs one padding call (a real forward, loss times zero) so that its reduction happens too.
The reduction is a sum (a communication hook that does not divide by the rank count): the loss is already
normalised by the step's supervised count over all ranks. Summing the same per-rank gradients, it gives the values
the earlier flat all-reduce gave, with no flat copy of the gradients (they live in DDP's buckets).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import ContextManager, Optional, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.training.checkpoint import LocalTrainState, TrainState
from deepspec_train.training.distributed import DistContext

# DDP's bucket size: big enough that a bucket's all-reduce is bandwidth-bound, small enough that the first ones
# start early in backward (torch's default).
BUCKET_MB = 25


class DrafterEngine(Protocol):
    """What the trainer needs of an engine; ``forward_module`` is what forwards (it may wrap the drafter)."""

    forward_module: nn.Module
    # torch autocast to bf16 around forwards (DeepSpeed's bf16 instead keeps a bf16 module of its own).
    autocast_bf16: bool

    def plan_step(self, local_calls: int) -> int:
        """Agree on this step's backward calls; returns how many zero-loss padding calls this rank must add."""
        ...

    def micro_batch(self) -> ContextManager:
        """The context of one planned call's forward and backward."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def clip(self) -> Optional[torch.Tensor]:
        """After the step's backward calls: clip the reduced gradients; their pre-clip norm as a device tensor, or
        None when the engine clips inside ``step``."""
        ...

    def step(self, skip: bool) -> tuple[torch.Tensor | float, bool]:
        """Apply the step's gradients (or drop them when ``skip``); the pre-clip gradient norm and whether the
        update was applied."""
        ...

    def train_state(self) -> TrainState: ...

    def finish(self) -> None:
        """Leave the drafter module holding its final fp32 weights (for the trained-drafter files)."""
        ...


def _sum_hook(group, bucket):
    """DDP communication hook: all-reduce a bucket as a sum (DDP's own hook divides by the rank count). DDP checks
    a hook's annotations against its own classes, which postponed (string) annotations fail: hence none here."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


class LocalEngine:
    """The DDP path: torch DDP over the drafter ranks (a plain module for one rank), torch clipping and AdamW.

    ``wrap=False`` keeps the plain module whatever the rank count: the trainer's engine before its replicas are
    synchronised, whose forwards are never reduced."""

    def __init__(self, cfg: RecipeConfig, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext,
                 wrap: bool = True):
        self.module = module
        self.optimizer = optimizer
        self.ctx = ctx
        self.grad_clip = cfg.train.grad_clip
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.autocast_bf16 = cfg.train.mixed_precision == "bf16" and ctx.device.type == "cuda"
        self.ddp: Optional[DistributedDataParallel] = None
        if wrap and ctx.distributed:
            # Buffers (rotary tables) are equal by construction: no broadcast before every forward. Gradients are
            # views into the buckets, so no second copy of them exists.
            with warnings.catch_warnings():
                # torch 2.13 renames broadcast_buffers (forward_sync_buffers); older releases know only this name.
                warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated", FutureWarning)
                self.ddp = DistributedDataParallel(module, process_group=ctx.group, broadcast_buffers=False,
                                                   gradient_as_bucket_view=True, bucket_cap_mb=BUCKET_MB)
            self.ddp.register_comm_hook(ctx.group, _sum_hook)
        self.forward_module: nn.Module = self.ddp if self.ddp is not None else module
        self._planned = 0
        self._calls = 0
        self._norm = torch.zeros(())

    def plan_step(self, local_calls: int) -> int:
        """Each rank's last call reduces; a rank with no call of its own needs one padding call to reduce."""
        self._planned = max(local_calls, 1) if self.ddp is not None else local_calls
        self._calls = 0
        return self._planned - local_calls

    def micro_batch(self) -> ContextManager:
        self._calls += 1
        if self.ddp is not None and self._calls < self._planned:
            return self.ddp.no_sync()
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip(self) -> torch.Tensor:
        """torch's clipping, all on the device: the norm and the clip factor are never read on the host."""
        self._norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        return self._norm

    def step(self, skip: bool) -> tuple[torch.Tensor, bool]:
        if not skip:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self._norm, not skip

    def train_state(self) -> TrainState:
        return LocalTrainState(self.module, self.optimizer)

    def finish(self) -> None:
        """Nothing to do: the module's own parameters are the fp32 weights."""


def make_engine(
    cfg: RecipeConfig, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext, run_dir: Path
) -> DrafterEngine:
    """The engine ``train.distributed`` names. Collective over the drafter ranks (DDP's and DeepSpeed's
    initialisation)."""
    if cfg.train.distributed == "deepspeed":
        from deepspec_train.training.deepspeed_engine import DeepSpeedDrafterEngine

        return DeepSpeedDrafterEngine(cfg, module, optimizer, ctx, run_dir)
    return LocalEngine(cfg, module, optimizer, ctx)
