"""The decision every drafter rank takes together before it applies an optimizer step: is the step finite, and
was the run asked to stop? One small collective and one read of its result: the step's only host sync.

- **Non-finite guard.** A NaN or inf in this rank's step loss or in the (already reduced, so equal on every rank)
  gradient norm marks the step bad on every rank (a MAX all-reduce of the flags), so all ranks skip the same
  update and their replicas stay equal. A skipped step keeps the weights and the optimizer state as they were;
  its data is consumed and the LR schedule moves on, so step numbers, the data plan and checkpoints stay those of
  the run without the bad batch. ``BadSteps`` counts skips, logs each one, and after ``train.max_bad_steps``
  consecutive ones ends the run with ``TooManyBadSteps``: one line, exit status 2, and no checkpoint written for
  it, so ``train.resume`` finds the last good one.
- **Preemption.** The same collective carries each rank's preemption flag (``training.preemption``), so the ranks
  agree on stopping after this step without a second read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from deepspec_train.common.errors import UserError
from deepspec_train.training import preemption
from deepspec_train.training.distributed import DistContext


class TooManyBadSteps(UserError):
    """``train.max_bad_steps`` consecutive steps had a non-finite loss or gradient norm."""


@dataclass(frozen=True)
class StepVerdict:
    # The loss or the gradient norm was NaN or inf on some rank: no rank applies the update.
    bad: bool
    # Some rank was asked to stop (preemption signal): every rank stops after this step.
    stop: bool


def agree_on_step(loss: torch.Tensor, grad_norm: Optional[torch.Tensor], ctx: DistContext) -> StepVerdict:
    """The verdict on this step, the same on every drafter rank (collective over ``ctx.group``). ``loss`` is this
    rank's step loss, ``grad_norm`` the reduced gradient norm (None when the engine computes it in its step)."""
    nonfinite = ~torch.isfinite(loss.detach()).all()
    if grad_norm is not None:
        nonfinite = nonfinite | ~torch.isfinite(grad_norm.detach()).all()
    # A fill kernel, not a host-to-device copy (which would wait for the stream).
    requested = torch.full_like(nonfinite, preemption.requested())
    flags = torch.stack([nonfinite, requested]).to(torch.int32)
    if ctx.distributed:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=ctx.group)
    bad, stop = flags.tolist()
    return StepVerdict(bool(bad), bool(stop))


class BadSteps:
    """Counts skipped steps (in a row and in all) and ends the run after ``limit`` in a row."""

    def __init__(self, limit: int, warn: Optional[Callable[[str], None]] = None) -> None:
        self.limit = limit
        self.warn = warn
        self.in_a_row = 0
        self.total = 0

    def record(self, step: int, bad: bool) -> None:
        """Count optimizer step ``step`` (1-based); raises ``TooManyBadSteps`` at the limit."""
        if not bad:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.total += 1
        if self.warn is not None:
            self.warn(f"step {step}: non-finite loss or gradient norm on a drafter rank; update skipped on every "
                      f"rank ({self.in_a_row} in a row, {self.total} in all)")
        if self.in_a_row >= self.limit:
            raise TooManyBadSteps(
                f"training stopped at step {step}: {self.in_a_row} steps in a row had a non-finite loss or gradient "
                f"norm (train.max_bad_steps={self.limit}); weights are those of the last good step and the last "
                f"checkpoint is kept (lower train.lr or check the data, then resume with train.resume=auto)"
            )
