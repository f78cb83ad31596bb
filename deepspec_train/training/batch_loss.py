"""Forward a drafter on one packed micro-batch and compute its loss: shared by training and validation.

The drafter's kind record (``kinds``) supplies what differs between kinds: the per-slot position weights
(DSpark/DFlash ``exp(-(k-1)/gamma_decay)``, EAGLE-3 ``ttt_decay ** k``), the draft-vocabulary map and the Markov
factor; Markov rows and confidence logits come with the drafter's output when it has those heads. The loss
switches of ``cfg.loss`` (distance term) are passed through; ``normalizer`` is the step's supervised-slot count
or, for per-sequence normalisation, one denominator per supervised row (``training.loss_normalizers``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.losses.selected_logit_loss import LossOutput, selected_logit_loss
from deepspec_train.packing.batch import PackedBatch


@dataclass
class BatchLoss:
    loss: LossOutput
    slot_index: torch.Tensor
    supervised_mask: torch.Tensor


def unwrap(model: nn.Module) -> nn.Module:
    """The drafter inside a DDP / DeepSpeed wrapper."""
    return getattr(model, "module", model)


def batch_loss(
    model: nn.Module,
    batch: PackedBatch,
    cfg: RecipeConfig,
    target_head_weight: torch.Tensor,
    normalizer: float | torch.Tensor,
    attention: str,
) -> BatchLoss:
    """Forward ``model`` (possibly wrapped) on ``batch`` and compute the weighted CE + TV + confidence loss."""
    drafter = unwrap(model)
    out = model(batch, attention=attention)
    labels = batch.labels[batch.supervised_mask]
    inputs = kind_spec(cfg.drafter.kind).loss_inputs(drafter, out, cfg)
    loss = selected_logit_loss(
        out.hidden,
        drafter.lm_head.weight,
        batch.target_hidden,
        target_head_weight,
        labels,
        inputs.weights.to(out.hidden.device),
        markov_rows=out.markov_rows,
        markov_w2=inputs.markov_w2,
        conf_logits=out.conf_logits,
        draft_to_target=inputs.draft_to_target,
        temperature=cfg.loss.temperature,
        alpha_ce=cfg.loss.alpha_ce,
        alpha_tv=cfg.loss.alpha_tv,
        alpha_conf=cfg.loss.alpha_conf,
        distance=cfg.loss.distance,
        chunk_size=cfg.loss.chunk_size,
        normalizer=normalizer,
    )
    return BatchLoss(loss=loss, slot_index=out.slot_index, supervised_mask=batch.supervised_mask)
