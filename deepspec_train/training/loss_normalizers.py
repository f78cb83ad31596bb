"""The denominators of one optimizer step's loss: per token (``loss.normalizer=token``) or per sequence
(``loss.normalizer=sequence``, see ``deepspec_train.losses.normalization``).

Both need numbers from the whole step on every drafter rank before the first backward, while the step's
micro-batches may still be on their way (a streamed step arrives one micro-batch at a time): the supervised-slot
count (one all-reduce, whose result stays on the device: the loss divides by it there, no host read) and, per sequence, the summed position weights of its rows, computed from the step's
per-sequence slot counts (``StepBatches.slot_counts``) and gathered over the drafter ranks (one all-gather of a
``{sequence id: weight sum}`` map, a few hundred numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from deepspec_train.losses.normalization import (
    merge_weight_sums, row_normalizers, row_sequence_ids, sequence_weight_sums,
)
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.distributed import DistContext
from deepspec_train.training.feature_source import StepBatches


@dataclass
class StepNormalizer:
    """One step's denominators: ``tokens`` (supervised slots over all ranks, at least 1: a 0-dim float64 tensor on
    the drafter's device) and, for per-sequence normalisation, each sequence's weight sum over all ranks (None: per
    token)."""

    tokens: torch.Tensor
    weight_sums: dict[int, float] | None
    num_sequences: int

    def rows(self, batch: PackedBatch) -> torch.Tensor:
        """The normaliser of ``batch``'s loss: the token count, or one denominator per supervised row."""
        if self.weight_sums is None:
            return self.tokens
        return row_normalizers(row_sequence_ids(batch), self.weight_sums, self.num_sequences)


def step_normalizers(
    step: StepBatches, loss: DrafterLoss, model: torch.nn.Module, ctx: DistContext
) -> StepNormalizer:
    """The step's ``StepNormalizer`` for the run's ``loss``; ``model`` (possibly wrapped) is the drafter being
    trained. Collective: every drafter rank calls it once per step, whatever its number of micro-batches."""
    # float64 holds any count exactly, as the Python float it replaces did.
    tokens = torch.full((), float(step.num_supervised), dtype=torch.float64, device=ctx.device)
    if ctx.distributed:
        dist.all_reduce(tokens, group=ctx.group)
    tokens = tokens.clamp_min(1.0)
    sequences = loss.cfg.train.global_batch_sequences
    if loss.cfg.loss.normalizer == "token":
        return StepNormalizer(tokens, None, sequences)
    weights = loss.slot_weights(model)
    sums = sequence_weight_sums(step.slot_counts, weights)
    if ctx.distributed:
        gathered: list = [None] * ctx.world_size
        dist.all_gather_object(gathered, sums, group=ctx.group)
        sums = merge_weight_sums(gathered)
    return StepNormalizer(tokens, sums, sequences)
